//! `orderpipe cdc` on the real stack: MariaDB's row-based binlog to
//! `cdc.<db>.<table>` through Kafka transactions, read back read_committed.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use orderpipe::cdc::change::{ChangeEvent, ChangeKind, topic_schema};
use orderpipe::codec::Codec;
use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use serde_json::json;
use sqlx::{AssertSqlSafe, MySqlPool, Row};

use crate::helpers::{
    CliRun, MYSQL_ADMIN_URL, Spawned, TestEnv, cdc_server_id, header, wait_for_status,
    wait_for_topic,
};

/// A test's cdc source: its database, its topics, its server id (the
/// router's cdc tests use it too).
pub(crate) struct Source {
    pub(crate) env: TestEnv,
    pub(crate) database: String,
    pub(crate) pool: MySqlPool,
    pub(crate) server_id: String,
    pub(crate) start: String,
}

impl Source {
    /// A fresh database with `ddl` run in it, and the cdc settings of this test.
    pub(crate) async fn new(ddl: &[&str]) -> Self {
        let env = TestEnv::new().with_database().await.with_cdc();
        let database = format!("op_{}", env.prefix);
        let pool = MySqlPool::connect(&format!("{MYSQL_ADMIN_URL}{database}"))
            .await
            .unwrap();
        for statement in ddl {
            sqlx::query(AssertSqlSafe(statement.to_string()))
                .execute(&pool)
                .await
                .unwrap();
        }
        let server_id = cdc_server_id();
        // The binlog's end now: the stream starts before the test's writes.
        let row = sqlx::query("SHOW MASTER STATUS")
            .fetch_one(&pool)
            .await
            .expect("binlog on (dev/stack.sh: log_bin)");
        let start = format!("{}:{}", row.get::<String, _>(0), row.get::<u64, _>(1));
        Self {
            env,
            database,
            pool,
            server_id,
            start,
        }
    }

    pub(crate) fn topic(&self, table: &str) -> String {
        format!("{}.cdc.{}.{table}", self.env.prefix, self.database)
    }

    pub(crate) fn spawn(&self, table: &str) -> Spawned {
        self.spawn_with(table, &[])
    }

    /// [`Source::spawn`] with more flags.
    pub(crate) fn spawn_with(&self, table: &str, extra: &[&str]) -> Spawned {
        let table = format!("{}.{table}", self.database);
        let mut args = vec![
            "cdc",
            "--table",
            &table,
            "--server-id",
            &self.server_id,
            "--start-position",
            &self.start,
        ];
        args.extend_from_slice(extra);
        self.env.spawn(&args)
    }

    /// `orderpipe cdc snapshot --table <db>.<table> EXTRA`.
    pub(crate) fn snapshot(&self, table: &str, extra: &[&str]) -> CliRun {
        let table = format!("{}.{table}", self.database);
        let mut args = vec![
            "cdc",
            "snapshot",
            "--blocking",
            "--table",
            &table,
            "--server-id",
            &self.server_id,
        ];
        args.extend_from_slice(extra);
        tokio::task::block_in_place(|| self.env.cli(&args))
    }

    /// The registry's schema of `message` (by its Confluent schema id), and
    /// the name and type of each field of its `data` record.
    pub(crate) async fn data_fields(
        &self,
        message: &OwnedMessage,
    ) -> (serde_json::Value, Vec<(String, serde_json::Value)>) {
        let id = orderpipe::codec::schema_id(message.payload().unwrap()).unwrap();
        let url = format!("{}/schemas/ids/{id}", self.env.settings.registry.url);
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let written: serde_json::Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        let schema: serde_json::Value =
            serde_json::from_str(written["schema"].as_str().unwrap()).unwrap();
        let data = &schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "data")
            .unwrap()["type"][1];
        let fields = data["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["name"].as_str().unwrap().to_string(),
                    f["type"][1].clone(),
                )
            })
            .collect();
        (schema, fields)
    }

    pub(crate) async fn exec(&self, statements: &[&str]) {
        let mut tx = self.pool.begin().await.unwrap();
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement.to_string()))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }

    /// Reads exactly `count` changes of `table` (read_committed; fails on
    /// fewer within the timeout or on one more) and decodes them.
    pub(crate) async fn changes(
        &self,
        table: &str,
        count: usize,
        timeout: Duration,
    ) -> Vec<(OwnedMessage, ChangeEvent)> {
        self.changes_on(&self.topic(table), count, timeout).await
    }

    /// [`Source::changes`] of any change topic.
    pub(crate) async fn changes_on(
        &self,
        topic: &str,
        count: usize,
        timeout: Duration,
    ) -> Vec<(OwnedMessage, ChangeEvent)> {
        let env = &self.env;
        let messages = tokio::task::block_in_place(|| {
            wait_for_topic(env, topic);
            env.read(topic, count, timeout)
        });
        self.decode(topic, messages).await
    }

    /// The change events of `messages`, records of change topic `topic`.
    pub(crate) async fn decode(
        &self,
        topic: &str,
        messages: Vec<OwnedMessage>,
    ) -> Vec<(OwnedMessage, ChangeEvent)> {
        let codec = Codec::new(
            &self.env.settings.registry,
            topic,
            &topic_schema(topic),
            false,
        )
        .unwrap();
        let mut out = Vec::new();
        for message in messages {
            let value = codec.decode_value(message.payload()).await.unwrap();
            let event = ChangeEvent::from_avro(value).unwrap();
            out.push((message, event));
        }
        out
    }
}

/// Changes per Kafka key, in offset order (one key is in one partition).
pub(crate) fn by_key(
    changes: &[(OwnedMessage, ChangeEvent)],
) -> BTreeMap<String, Vec<&ChangeEvent>> {
    let mut sorted: Vec<&(OwnedMessage, ChangeEvent)> = changes.iter().collect();
    sorted.sort_by_key(|(m, _)| (m.partition(), m.offset()));
    let mut keys: BTreeMap<String, Vec<&ChangeEvent>> = BTreeMap::new();
    for (message, event) in sorted {
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        assert_eq!(
            key, event.key,
            "the Kafka key is the envelope's primary key"
        );
        keys.entry(key).or_default().push(event);
    }
    keys
}

#[tokio::test(flavor = "multi_thread")]
async fn inserts_updates_and_deletes_reach_the_topic_in_commit_order_per_key_with_old_on_updates() {
    let source = Source::new(&[
        "CREATE TABLE table_user (id BIGINT PRIMARY KEY, status INT NOT NULL, name VARCHAR(40), \
         balance DECIMAL(10,2), created_at DATETIME(3))",
        "CREATE TABLE other (id BIGINT PRIMARY KEY, v INT)",
    ])
    .await;
    let mut cdc = source.spawn("table_user");
    source
        .exec(&["INSERT INTO table_user VALUES (1, 1, 'ann', 12.50, '2026-12-01 06:00:00.123'), (2, 1, 'bob', NULL, NULL), (3, 1, 'cy', 0, NULL)"])
        .await;
    source
        .exec(&["UPDATE table_user SET status = 2 WHERE id = 1"])
        .await;
    source
        .exec(&["UPDATE table_user SET name = 'bobby' WHERE id = 2"])
        .await;
    source.exec(&["DELETE FROM table_user WHERE id = 3"]).await;
    // A transaction over a captured and an uncaptured table.
    source
        .exec(&[
            "INSERT INTO other VALUES (1, 1)",
            "INSERT INTO table_user (id, status) VALUES (4, 1)",
        ])
        .await;
    source
        .exec(&["UPDATE table_user SET status = 3 WHERE id = 1"])
        .await;
    // A column added during the stream shows up in later events.
    source
        .exec(&["ALTER TABLE table_user ADD COLUMN email VARCHAR(80) NULL"])
        .await;
    source
        .exec(&["UPDATE table_user SET email = 'b@x.io' WHERE id = 2"])
        .await;

    let changes = source
        .changes("table_user", 9, Duration::from_secs(60))
        .await;
    assert!(matches!(cdc.try_wait(), Ok(None)), "cdc still runs");
    let db = &source.database;
    let names = |events: &[&ChangeEvent]| {
        events
            .iter()
            .map(|e| e.event_name.clone())
            .collect::<Vec<_>>()
    };
    let keys = by_key(&changes);
    let user1 = &keys["1"];
    assert_eq!(
        names(user1),
        [
            format!("{db}.table_user.insert"),
            format!("{db}.table_user.update"),
            format!("{db}.table_user.update")
        ]
    );
    assert_eq!(
        user1[0].data,
        json!({"id": 1, "status": 1, "name": "ann", "balance": "12.50", "created_at": "2026-12-01T06:00:00.123"})
    );
    assert_eq!(user1[0].old, None);
    assert_eq!(
        user1[1].old,
        Some(json!({"status": 1})),
        "old holds the changed columns' previous values"
    );
    assert_eq!(user1[1].data["status"], json!(2));
    assert_eq!(user1[2].old, Some(json!({"status": 2})));
    assert_eq!(user1[2].data["status"], json!(3));
    let user2 = &keys["2"];
    assert_eq!(user2[1].old, Some(json!({"name": "bob"})));
    assert_eq!(
        user2[2].data["email"],
        json!("b@x.io"),
        "the added column is in later events"
    );
    assert_eq!(user2[2].old, Some(json!({"email": null})));
    assert!(
        user2[1].data.get("email").is_none(),
        "earlier events do not invent it"
    );
    let user3 = &keys["3"];
    assert_eq!(
        names(user3),
        [
            format!("{db}.table_user.insert"),
            format!("{db}.table_user.delete")
        ]
    );
    assert_eq!(
        user3[1].data["name"],
        json!("cy"),
        "a delete carries the deleted row"
    );
    assert_eq!(keys["4"][0].change, ChangeKind::Insert);
    // The envelope: house fields, headers, transaction coordinates.
    for (message, event) in &changes {
        assert_eq!(
            header(message, "event_id"),
            Some(event.event_id.to_string())
        );
        assert_eq!(
            header(message, "event_name").as_deref(),
            Some(event.event_name.as_str())
        );
        assert_eq!(event.producer, format!("cdc:{}", source.env.prefix));
        assert!(
            event.gtid.as_deref().is_some_and(|g| g.starts_with("0-1-")),
            "{:?}",
            event.gtid
        );
        assert!(
            event.xid.is_some()
                && event.binlog_pos > 4
                && event.binlog_file.starts_with("mariadb-bin."),
            "{event:?}"
        );
    }
    // One schema version for every event, before and after the ALTER.
    let ids: HashSet<u32> = changes
        .iter()
        .map(|(m, _)| orderpipe::codec::schema_id(m.payload().unwrap()).unwrap())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    // Commit order across rows: the GTIDs' sequence numbers never go back in a key's history.
    for events in keys.values() {
        let seqs: Vec<u64> = events
            .iter()
            .map(|e| {
                e.gtid
                    .as_ref()
                    .unwrap()
                    .rsplit('-')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
    // The checkpoint, committed with the records, is at the last transaction's end.
    let offsets = format!("{}.cdc.offsets", source.env.prefix);
    let checkpoint = orderpipe::cdc::checkpoint::last_committed(
        &source.env.settings.kafka,
        &offsets,
        &source.env.prefix,
    )
    .await
    .unwrap()
    .expect("a checkpoint");
    let last = changes
        .iter()
        .map(|(_, e)| e)
        .max_by_key(|e| (e.binlog_file.clone(), e.binlog_pos))
        .unwrap();
    // At or past it: other tests' transactions (other databases) move the position too.
    assert!(
        (&checkpoint.position.file, checkpoint.position.pos)
            >= (&last.binlog_file, last.binlog_pos),
        "{checkpoint:?} vs {last:?}"
    );
    cdc.kill().unwrap();
}

/// Polls `path` on `addr` until it answers `status` (30 s at most); returns the body.
#[tokio::test(flavor = "multi_thread")]
async fn cdc_is_ready_once_streaming_and_a_source_that_does_not_answer_is_live_not_ready_saying_why()
 {
    let mut source = Source::new(&["CREATE TABLE r (id INT PRIMARY KEY)"]).await;
    let table = format!("{}.r", source.database);
    let args = [
        "cdc",
        "--table",
        &table,
        "--server-id",
        &source.server_id,
        "--start-position",
        &source.start,
        "--health-addr",
        "127.0.0.1:0",
    ];
    // The real source: ready, both conditions met; a change is published.
    let mut cdc = source.env.spawn(&args);
    let addr = crate::helpers::health_addr(&mut cdc);
    let body = tokio::task::block_in_place(|| {
        wait_for_status(&addr, "/health/ready", 200, "", Duration::from_secs(30))
    });
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        ready["conditions"],
        json!({"binlog_stream": true, "kafka_producer": true}),
        "{body}"
    );
    source.exec(&["INSERT INTO r VALUES (1)"]).await;
    assert_eq!(
        source.changes("r", 1, Duration::from_secs(30)).await.len(),
        1
    );
    crate::consumer::sigterm(&mut cdc);
    assert!(cdc.wait().unwrap().success());
    // Nothing listens on port 1: live, not ready, and the reason names the source; SIGTERM still exits 0.
    source.env.set_env(
        "ORDERPIPE_CDC__SOURCE",
        "mysql://orderpipe:orderpipe@127.0.0.1:1/",
    );
    let mut cdc = source.env.spawn(&args);
    let addr = crate::helpers::health_addr(&mut cdc);
    // Waited for until the reason names the failed connection (not yet
    // connected at first), not assumed after a fixed 2 s.
    let (body, live) = tokio::task::block_in_place(|| {
        (
            wait_for_status(
                &addr,
                "/health/ready",
                503,
                "cannot connect to the source database",
                Duration::from_secs(30),
            ),
            crate::helpers::http_get(&addr, "/health/live").0,
        )
    });
    assert_eq!(live, 200);
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["conditions"]["binlog_stream"], false, "{body}");
    let reasons = ready["reasons"].to_string();
    assert!(
        reasons.contains("binlog_stream: cannot connect to the source database")
            && reasons.contains("retrying in"),
        "{body}"
    );
    assert!(
        matches!(cdc.try_wait(), Ok(None)),
        "cdc keeps retrying, it does not exit"
    );
    crate::consumer::sigterm(&mut cdc);
    assert!(cdc.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_without_a_primary_key_is_refused_by_name() {
    let source = Source::new(&["CREATE TABLE no_key (a INT, b INT)"]).await;
    let table = format!("{}.no_key", source.database);
    let run = source
        .env
        .cli(&["cdc", "--table", &table, "--server-id", &source.server_id]);
    let text = run.failure();
    assert!(
        text.contains(&format!("table {table} has no primary key")),
        "{text}"
    );
    let missing = format!("{}.nope", source.database);
    let text = source
        .env
        .cli(&["cdc", "--table", &missing, "--server-id", &source.server_id])
        .failure();
    assert!(
        text.contains(&format!("table {missing} does not exist")),
        "{text}"
    );
    let text = source
        .env
        .cli(&["cdc", "--table", "nodot", "--server-id", &source.server_id])
        .failure();
    assert!(
        text.contains("cdc.tables[0]") && text.contains("<database>.<table>"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_position_the_server_does_not_have_stops_the_source_naming_it() {
    let source = Source::new(&["CREATE TABLE t (id INT PRIMARY KEY)"]).await;
    let table = format!("{}.t", source.database);
    let args = [
        "cdc",
        "--table",
        &table,
        "--server-id",
        &source.server_id,
        "--start-position",
        "mariadb-bin.999999:4",
    ];
    let text = source.env.cli(&args).failure();
    assert!(
        text.contains("the source has no binlog at mariadb-bin.999999:4")
            && text.contains("--start-position"),
        "{text}"
    );
}

/// Writes `transactions` transactions of `rows` inserts and one update of an
/// earlier row while the cdc process is SIGKILLed `kills` times and
/// restarted; then every change must be on the topic exactly once, in
/// commit order per key, for a read_committed reader.
async fn killed_mid_stream(transactions: u64, rows: u64, kills: u32) {
    let source =
        Source::new(&["CREATE TABLE ledger (id BIGINT PRIMARY KEY, version INT NOT NULL)"]).await;
    let mut cdc = source.spawn("ledger");
    let writer = {
        let pool = source.pool.clone();
        tokio::spawn(async move {
            for t in 0..transactions {
                let values: Vec<String> = (0..rows)
                    .map(|r| format!("({}, 0)", t * rows + r + 1))
                    .collect();
                // Bump an earlier row: per key, versions must arrive 0, 1, 2, ...
                let earlier = (t * 7919) % ((t + 1) * rows) + 1;
                // One round trip per transaction (the text protocol's multi-statement batch).
                let sql = format!(
                    "BEGIN; INSERT INTO ledger VALUES {}; UPDATE ledger SET version = version + 1 WHERE id = {earlier}; COMMIT",
                    values.join(",")
                );
                sqlx::raw_sql(AssertSqlSafe(sql))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
        })
    };
    let started = Instant::now();
    for kill in 0..kills {
        tokio::time::sleep(Duration::from_millis(1500 + 700 * u64::from(kill % 3))).await;
        cdc.kill().unwrap();
        cdc.wait().unwrap();
        cdc = source.spawn("ledger");
    }
    writer.await.unwrap();
    let written = started.elapsed();
    let expected = (transactions * (rows + 1)) as usize;
    let timeout = Duration::from_secs(120 + transactions / 100);
    let changes = source.changes("ledger", expected, timeout).await;
    eprintln!(
        "{expected} changes written in {written:?}, all read through {kills} SIGKILLs after {:?}",
        started.elapsed()
    );
    let ids: HashSet<_> = changes.iter().map(|(_, e)| e.event_id).collect();
    assert_eq!(ids.len(), expected, "no change twice");
    let (mut inserts, mut updates) = (0, 0);
    for (key, events) in by_key(&changes) {
        assert_eq!(
            events[0].change,
            ChangeKind::Insert,
            "key {key}: the insert comes first"
        );
        for (version, event) in events.iter().enumerate() {
            assert_eq!(
                event.data["version"],
                json!(version),
                "key {key}: versions in commit order"
            );
        }
        inserts += 1;
        updates += events.len() - 1;
    }
    assert_eq!(
        (inserts, updates),
        ((transactions * rows) as usize, transactions as usize),
        "none missing"
    );
    cdc.kill().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cdc_killed_three_times_mid_stream_loses_and_duplicates_no_change() {
    killed_mid_stream(600, 4, 3).await;
}

/// The issue's measure: 5 SIGKILLs during 50k row changes.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "soak: the issue's full size (make test runs cdc::a_cdc_killed_three_times_mid_stream_loses_and_duplicates_no_change); run by `make soak`"]
async fn a_cdc_killed_five_times_during_50k_row_changes_delivers_each_exactly_once() {
    killed_mid_stream(10_000, 4, 5).await;
}

/// The issue's snapshot measure: a 100k-row table bootstrapped while writes
/// go on, between a stream stopped before it and started after it.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "soak: the issue's size (make test runs the 10k sibling); run by `make soak`"]
async fn a_snapshot_of_a_100k_row_table_between_the_stream_loses_no_row_and_duplicates_none() {
    snapshot_between_the_stream(100_000).await;
}

/// make test's sibling of the 100k snapshot: the same interleaving.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: heavy; run by `make test` in the serial phase"]
async fn a_snapshot_of_a_10k_row_table_between_the_stream_loses_no_row_and_duplicates_none() {
    snapshot_between_the_stream(10_000).await;
}

/// A `rows`-row table, a writer inserting and updating all along; the stream
/// runs until it has committed 500 changes, is killed, `cdc snapshot` runs,
/// the stream starts again.
async fn snapshot_between_the_stream(rows: u64) {
    let source = Source::new(&[
        "CREATE TABLE big (id BIGINT PRIMARY KEY, version INT NOT NULL)",
        &format!("INSERT INTO big SELECT seq, 0 FROM seq_1_to_{rows}"),
    ])
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (pool, stop) = (source.pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut transactions = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (new, old) = (rows + 1 + transactions, (transactions * 7919) % rows + 1);
                let sql = format!(
                    "BEGIN; INSERT INTO big VALUES ({new}, 0); UPDATE big SET version = version + 1 WHERE id = {old}; COMMIT"
                );
                sqlx::raw_sql(AssertSqlSafe(sql))
                    .execute(&pool)
                    .await
                    .unwrap();
                transactions += 1;
            }
            transactions
        })
    };
    // The stream runs until it has published 500 records: a fixed 2 s was
    // too short on a loaded broker.
    let topic = source.topic("big");
    let mut cdc = source.spawn("big");
    published(&source.env, &topic, 500, &mut cdc).await;
    let before = cdc.stop_and_output();
    let run = source.snapshot("big", &["--output", "json"]);
    let summary: serde_json::Value = serde_json::from_str(&run.success()).unwrap();
    let snapshot_rows = summary["rows"].as_u64().unwrap();
    assert!(snapshot_rows >= rows, "{summary}");
    // The writer goes on until the restarted stream has published 1,000
    // records past the snapshot's.
    let snapshot_end = topic_end(&source.env, &topic);
    let mut cdc = source.spawn("big");
    published(&source.env, &topic, snapshot_end + 1_000, &mut cdc).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let transactions = writer.await.unwrap();
    let expected = (2 * transactions + snapshot_rows) as usize;
    eprintln!("the snapshot: {summary}; the stream before it:\n{before}");
    let messages = read_or_show(
        &source.env,
        &topic,
        expected,
        Duration::from_secs(300),
        &mut [&mut cdc],
    );
    let changes = source.decode(&topic, messages).await;
    eprintln!(
        "snapshot of {snapshot_rows} rows ({} s) between {transactions} transactions of the stream",
        run.elapsed.as_secs_f64()
    );
    let ids: HashSet<_> = changes.iter().map(|(_, e)| e.event_id).collect();
    assert_eq!(ids.len(), expected, "no change or row twice");
    let keys = by_key(&changes);
    let table_rows: Vec<(i64, i32)> = sqlx::query_as("SELECT id, version FROM big")
        .fetch_all(&source.pool)
        .await
        .unwrap();
    assert_eq!(
        keys.len(),
        table_rows.len(),
        "every row of the table has a history on the topic"
    );
    for (id, version) in table_rows {
        let events = &keys[&id.to_string()];
        let versions: Vec<i64> = events
            .iter()
            .map(|e| e.data["version"].as_i64().unwrap())
            .collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "key {id}: {versions:?}"
        );
        assert_eq!(
            *versions.last().unwrap(),
            i64::from(version),
            "key {id}: the topic ends in the table's state"
        );
    }
    cdc.kill().unwrap();
}

/// [`TestEnv::read`] of an existing `topic`, failing with what `streams`
/// printed when the records do not arrive.
fn read_or_show(
    env: &TestEnv,
    topic: &str,
    count: usize,
    timeout: Duration,
    streams: &mut [&mut Spawned],
) -> Vec<OwnedMessage> {
    let read = tokio::task::block_in_place(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            env.read(topic, count, timeout)
        }))
    });
    read.unwrap_or_else(|shortfall| {
        let printed: Vec<String> = streams.iter_mut().map(|s| s.stop_and_output()).collect();
        panic!(
            "{:?}; the streams printed:\n{}",
            shortfall.downcast_ref::<String>(),
            printed.join("\n---\n")
        )
    })
}

/// Waits until `topic`'s high watermarks add up to `end` (records and
/// transaction markers); fails after 120 s with what `stream` printed.
async fn published(env: &TestEnv, topic: &str, end: i64, stream: &mut Spawned) {
    tokio::task::block_in_place(|| wait_for_topic(env, topic));
    let deadline = Instant::now() + Duration::from_secs(120);
    while topic_end(env, topic) < end {
        assert!(
            Instant::now() < deadline,
            "{topic} did not reach {end} records in 120 s; the stream printed:\n{}",
            stream.stop_and_output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The sum of `topic`'s high watermarks: records and transaction markers.
/// A partition without a leader yet (a topic just created, or a broker
/// just restarted by the serial test before) is asked again, for 60 s.
fn topic_end(env: &TestEnv, topic: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer =
        orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
            .create()
            .unwrap();
    let end = || -> rdkafka::error::KafkaResult<i64> {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        metadata.topics()[0]
            .partitions()
            .iter()
            .map(|p| {
                consumer
                    .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                    .map(|(_, high)| high)
            })
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match end() {
            Ok(end) => return end,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{topic}'s watermarks: {e}; asking again");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("{topic}'s watermarks for 60 s: {e}"),
        }
    }
}

/// Measures the lag from a row's commit in MariaDB to a read_committed
/// consumer holding its change, single-row transactions 5 ms apart.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: a measurement; run by `make test` in the serial phase"]
async fn lag_from_binlog_commit_to_a_read_committed_consumer() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let source =
        Source::new(&["CREATE TABLE lat (id BIGINT PRIMARY KEY, written_at DATETIME(6) NOT NULL)"])
            .await;
    let mut cdc = source.spawn_with("lat", &["--output", "json"]);
    let topic = source.topic("lat");
    let count = 2_000u64;
    let reader = {
        let (env, topic) = (&source.env, topic.clone());
        wait_for_topic(env, &topic);
        let consumer: BaseConsumer =
            orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
                .set("group.id", format!("{}-lag", env.prefix))
                .set("isolation.level", "read_committed")
                .set("enable.auto.commit", "false")
                .set("fetch.wait.max.ms", "10")
                .create()
                .unwrap();
        let mut assignment = rdkafka::TopicPartitionList::new();
        for p in 0..3 {
            assignment
                .add_partition_offset(&topic, p, rdkafka::Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        std::thread::spawn(move || {
            let mut received = Vec::new();
            // The writes alone take 10 s quiet and several times that on a
            // loaded machine; the lag is measured per change, not by this bound.
            let deadline = Instant::now() + Duration::from_secs(300);
            while (received.len() as u64) < count && Instant::now() < deadline {
                if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
                    received.push((message.detach(), chrono::Utc::now()));
                }
            }
            received
        })
    };
    let writing = Instant::now();
    for i in 0..count {
        let sql = format!("INSERT INTO lat VALUES ({i}, UTC_TIMESTAMP(6))");
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&source.pool)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let writing = writing.elapsed();
    let received = tokio::task::block_in_place(|| reader.join().unwrap());
    assert_eq!(
        received.len() as u64,
        count,
        "every change reached the consumer within 300 s: {}",
        cdc.stop_and_output()
    );
    let codec = Codec::new(
        &source.env.settings.registry,
        &topic,
        &topic_schema(&topic),
        false,
    )
    .unwrap();
    let mut lags = Vec::new();
    for (message, at) in &received {
        let event =
            ChangeEvent::from_avro(codec.decode_value(message.payload()).await.unwrap()).unwrap();
        let written = chrono::NaiveDateTime::parse_from_str(
            event.data["written_at"].as_str().unwrap(),
            "%Y-%m-%dT%H:%M:%S%.f",
        )
        .unwrap()
        .and_utc();
        lags.push((*at - written).num_microseconds().unwrap() as f64 / 1000.0);
    }
    lags.sort_by(f64::total_cmp);
    let at = |q: f64| lags[((lags.len() as f64 - 1.0) * q) as usize];
    eprintln!(
        "cdc lag, commit to read_committed consumer, {count} single-row transactions 5 ms apart: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    assert!(at(0.99) < 5_000.0, "p99 {} ms", at(0.99));
    // A Kafka transaction that waits for nothing takes a few ms here; one
    // whose commit waited out rdkafka's 100 ms flush step (the commit
    // called before the delivery reports were in) took ~100 ms, so the
    // stream could not hold more than one per 100 ms of writing. The
    // bound, 1.5 per 100 ms, is out of reach for such a commit and a sixth
    // of what 10 ms per transaction makes of this stream.
    let summary = crate::outbox::stop(&mut cdc);
    let transactions = summary["kafka_transactions"].as_u64().unwrap();
    let at_100ms = writing.as_secs_f64() / 0.1;
    eprintln!(
        "{transactions} Kafka transactions in {:.1} s of writing",
        writing.as_secs_f64()
    );
    assert!(
        transactions as f64 > 1.5 * at_100ms,
        "{transactions} Kafka transactions for {count} single-row transactions over {:.1} s: \
         about 100 ms each, a commit waiting on something other than the broker",
        writing.as_secs_f64()
    );
    // The summary says where the time went: every stage of every batch
    // (gather: of the batches with changes, not other tables' alone).
    let stages = &summary["stages_ms"];
    eprintln!("cdc stage times (ms per batch): {stages}");
    for (stage, at_least) in [
        ("gather", count.min(1)),
        ("encode", transactions),
        ("produce", transactions),
        ("commit", transactions),
    ] {
        let timed = stages[stage]["count"].as_u64().unwrap_or(0);
        assert!(
            timed >= at_least,
            "{timed} batches timed in stage {stage}, {transactions} transactions: {stages}"
        );
    }
}

/// `[cdc] value_format = "avro"`: a snapshot and the stream write a table's
/// rows with one per-table schema (the snapshot's query types and the
/// table map's agree), typed values decoding to the JSON form's.
#[tokio::test(flavor = "multi_thread")]
async fn with_value_format_avro_a_snapshot_and_the_stream_share_one_typed_schema() {
    let mut source = Source::new(&[
        "CREATE TABLE typed (id BIGINT PRIMARY KEY, small TINYINT, price DOUBLE, name VARCHAR(20), \
         balance DECIMAL(10,2), at DATETIME(3), body TEXT, born DATE)",
        "INSERT INTO typed VALUES (1, -3, 1.5, 'ann', 12.50, '2026-12-01 06:00:00.123', 'hi', '2000-01-02')",
    ])
    .await;
    source.env.set_env("ORDERPIPE_CDC__VALUE_FORMAT", "avro");
    source.snapshot("typed", &[]).success();
    let mut cdc = source.spawn("typed");
    source
        .exec(&["INSERT INTO typed (id, small, name) VALUES (2, 7, NULL)"])
        .await;
    source
        .exec(&["UPDATE typed SET name = 'bob', price = 2.25 WHERE id = 2"])
        .await;
    let changes = source.changes("typed", 3, Duration::from_secs(60)).await;
    let ids: HashSet<u32> = changes
        .iter()
        .map(|(m, _)| orderpipe::codec::schema_id(m.payload().unwrap()).unwrap())
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "one schema for the snapshot's and the stream's rows"
    );
    let (schema, types) = source.data_fields(&changes[0].0).await;
    assert_eq!(
        schema["namespace"],
        json!(format!("orderpipe.cdc.v1.tables.{}.typed", source.database)),
        "{schema}"
    );
    let types: Vec<(&str, &serde_json::Value)> =
        types.iter().map(|(name, t)| (name.as_str(), t)).collect();
    assert_eq!(
        types,
        [
            ("id", &json!("long")),
            ("small", &json!("long")),
            ("price", &json!("double")),
            ("name", &json!("string")),
            ("balance", &json!("string")),
            ("at", &json!("string")),
            ("body", &json!("string")),
            ("born", &json!("string"))
        ]
    );
    // Rows 1 and 2 may be on different partitions: only a key's order holds.
    let keys = by_key(&changes);
    let (row1, row2) = (&keys["1"], &keys["2"]);
    assert_eq!(row1.len(), 1, "{row1:?}");
    assert_eq!(
        row1[0].data,
        json!({"id": 1, "small": -3, "price": 1.5, "name": "ann", "balance": "12.50",
               "at": "2026-12-01T06:00:00.123", "body": "hi", "born": "2000-01-02"})
    );
    assert_eq!(row2.len(), 2, "{row2:?}");
    assert_eq!(row2[0].change, ChangeKind::Insert);
    assert_eq!(row2[0].data["small"], json!(7));
    assert_eq!(row2[0].data["name"], json!(null));
    assert_eq!(row2[1].change, ChangeKind::Update);
    assert_eq!(row2[1].old, Some(json!({"name": null, "price": null})));
    assert_eq!(row2[1].data["price"], json!(2.25));
    assert!(matches!(cdc.try_wait(), Ok(None)), "cdc still runs");
    let _ = cdc.kill();
}
