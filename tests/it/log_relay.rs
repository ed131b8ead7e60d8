//! The log-based outbox relay (`relay --source binlog`) against MariaDB's
//! binlog and Kafka: the records it writes are the polling relay's, byte
//! for byte; SIGKILLs and failovers to a standby lose no row and show none
//! twice; published rows leave the table.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use sqlx::{AssertSqlSafe, MySqlPool, Row};

use crate::helpers::{MYSQL_ADMIN_URL, Spawned, TestEnv, cdc_server_id, header, mariadb_port};
use crate::outbox::{drive_orders, read_settled, start_api};

/// A test database whose outbox inserts are also copied (by a trigger, in
/// the same transaction) to `outbox_copy`: the oracle of what was written,
/// in id order, after the relay deleted the published rows.
async fn log_env() -> (TestEnv, MySqlPool) {
    let mut env = TestEnv::new().with_database().await;
    let prefix = env.prefix.clone();
    env.set_env("ORDERPIPE_OUTBOX__BINLOG_NAME", &format!("{prefix}-outbox"));
    env.set_env(
        "ORDERPIPE_OUTBOX__OFFSETS_TOPIC",
        &format!("{prefix}.outbox.offsets"),
    );
    env.set_env("ORDERPIPE_OUTBOX__BINLOG_SERVER_ID", &cdc_server_id());
    let pool = MySqlPool::connect(&format!("{MYSQL_ADMIN_URL}op_{prefix}"))
        .await
        .unwrap();
    for ddl in [
        "CREATE TABLE outbox_copy (id BIGINT PRIMARY KEY, event_id CHAR(36) NOT NULL, message_key VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, event_name VARCHAR(128) NOT NULL)",
        "CREATE TRIGGER outbox_copy_insert AFTER INSERT ON outbox_messages FOR EACH ROW \
         INSERT INTO outbox_copy (id, event_id, message_key, topic, event_name) VALUES (NEW.id, NEW.event_id, NEW.message_key, NEW.topic, NEW.event_name)",
    ] {
        sqlx::query(AssertSqlSafe(ddl))
            .execute(&pool)
            .await
            .unwrap();
    }
    env.cli(&["topics", "ensure"]).success();
    (env, pool)
}

/// The binlog's end now (`FILE:POS`).
async fn binlog_end(pool: &MySqlPool) -> String {
    let row = sqlx::query("SHOW MASTER STATUS")
        .fetch_one(pool)
        .await
        .unwrap();
    format!("{}:{}", row.get::<String, _>(0), row.get::<u64, _>(1))
}

/// What the service wrote: per topic, (key, event id) in id order.
async fn written(pool: &MySqlPool) -> BTreeMap<String, Vec<(String, String)>> {
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT topic, message_key, event_id FROM outbox_copy ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    let mut by_topic: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (topic, key, id) in rows {
        by_topic.entry(topic).or_default().push((key, id));
    }
    by_topic
}

/// What the service wrote, counted per (topic, event name).
async fn produced_per_event(pool: &MySqlPool) -> BTreeMap<(String, String), u64> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT topic, event_name, COUNT(*) FROM outbox_copy GROUP BY topic, event_name",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(topic, event, n)| ((topic, event), n as u64))
        .collect()
}

/// The `orderpipe_produced_records_total` series on `addr`'s /metrics, per (topic, event name).
fn produced_series(addr: &str) -> BTreeMap<(String, String), u64> {
    let (_, body) = crate::helpers::http_get(addr, "/metrics");
    let label = |labels: &str, name: &str| {
        let start = labels.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        labels[start..][..labels[start..].find('"').unwrap()].to_string()
    };
    body.lines()
        .filter_map(|l| l.strip_prefix("orderpipe_produced_records_total{"))
        .map(|rest| {
            let (labels, value) = rest.split_once("} ").unwrap();
            (
                (label(labels, "topic"), label(labels, "event_name")),
                value.trim().parse().unwrap(),
            )
        })
        .collect()
}

async fn count(pool: &MySqlPool, sql: &'static str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(pool).await.unwrap();
    n
}

/// Every record of `topic` read_committed, once the topic holds `expected`
/// of them (fails after `limit`).
fn read_when(env: &TestEnv, topic: &str, expected: usize, limit: Duration) -> Vec<OwnedMessage> {
    let deadline = Instant::now() + limit;
    loop {
        let records = read_settled(env, topic);
        if records.len() >= expected || Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Each written event exactly once on its topic and, per order, in the
/// order the service wrote them.
fn assert_once_in_order(
    env: &TestEnv,
    written: &BTreeMap<String, Vec<(String, String)>>,
    limit: Duration,
) {
    for (topic, rows) in written {
        let records = read_when(env, topic, rows.len(), limit);
        let ids: Vec<String> = records
            .iter()
            .map(|m| header(m, "event_id").unwrap())
            .collect();
        let unique: BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "{topic}: an event twice");
        let expected: BTreeSet<&String> = rows.iter().map(|(_, id)| id).collect();
        assert_eq!(
            unique, expected,
            "{topic}: the events written, no more, no less"
        );
        let mut on_topic: BTreeMap<String, Vec<(i32, i64, String)>> = BTreeMap::new();
        for m in &records {
            let key = String::from_utf8_lossy(m.key().unwrap()).into_owned();
            on_topic.entry(key).or_default().push((
                m.partition(),
                m.offset(),
                header(m, "event_id").unwrap(),
            ));
        }
        let mut per_order: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (key, id) in rows {
            per_order.entry(key).or_default().push(id);
        }
        for (key, ids) in per_order {
            let mut got = on_topic.remove(key).unwrap();
            got.sort();
            let got: Vec<&str> = got.iter().map(|g| g.2.as_str()).collect();
            assert_eq!(got, ids, "{topic}: order {key} out of order");
        }
    }
}

fn log_relay(env: &TestEnv, instance: &str, extra: &[&str]) -> Spawned {
    relay_from(env, "binlog", instance, extra)
}

fn relay_from(env: &TestEnv, source: &str, instance: &str, extra: &[&str]) -> Spawned {
    let mut args = vec![
        "relay",
        "--source",
        source,
        "--instance",
        instance,
        "--output",
        "json",
    ];
    args.extend_from_slice(extra);
    env.spawn(&args)
}

/// (partition, key, value, headers) of a record.
type Bytes = (i32, Vec<u8>, Vec<u8>, Vec<(String, Vec<u8>)>);

fn bytes_of(m: &OwnedMessage) -> Bytes {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    (
        m.partition(),
        m.key().unwrap_or_default().to_vec(),
        m.payload().unwrap_or_default().to_vec(),
        headers,
    )
}

/// The same outbox rows published by the polling relay, then read from the
/// binlog from before they were written (by `--source auto`, which picks the
/// binlog here): every record twice on its topic,
/// the two equal in partition, key, value and headers, byte for byte. The
/// polling relay's marks (updates) are in the binlog too and publish
/// nothing; the log relay deletes the rows it published.
#[tokio::test(flavor = "multi_thread")]
async fn the_log_relay_writes_the_polling_relays_records_byte_for_byte() {
    let (env, pool) = log_env().await;
    let start = binlog_end(&pool).await;
    let api = start_api(&env).await;
    drive_orders(&api, 60, 8).await;
    let written = written(&pool).await;
    let rows: usize = written.values().map(Vec::len).sum();
    assert!(written.len() == 2 && rows > 150, "{rows} rows: {written:?}");
    env.cli(&[
        "relay",
        "--source",
        "poll",
        "--instance",
        "poll",
        "--until-idle",
        "2",
    ])
    .success();
    // `auto` reads the binlog where the database allows it, as the dev stack's does.
    let mut relay = relay_from(
        &env,
        "auto",
        "log",
        &["--start-position", &start, "--health-addr", "127.0.0.1:0"],
    );
    let health = crate::helpers::health_addr(&mut relay);
    let mut compared = 0;
    for (topic, events) in &written {
        let records = read_when(&env, topic, 2 * events.len(), Duration::from_secs(60));
        assert_eq!(
            records.len(),
            2 * events.len(),
            "{topic}: both relays' records"
        );
        let mut by_id: BTreeMap<String, Vec<Bytes>> = BTreeMap::new();
        for m in &records {
            by_id
                .entry(header(m, "event_id").unwrap())
                .or_default()
                .push(bytes_of(m));
        }
        for (id, pair) in &by_id {
            assert_eq!(pair.len(), 2, "{topic} {id}: one record from each relay");
            assert_eq!(
                pair[0], pair[1],
                "{topic} {id}: the two relays' records differ"
            );
            assert_eq!(pair[0].3.len(), 5, "{topic} {id}: the five headers");
            compared += 1;
        }
    }
    assert_eq!(compared, rows);
    // `orderpipe_produced_records_total` counts the log relay's records per topic
    // and event name, as the service wrote them.
    let wanted = produced_per_event(&pool).await;
    let got = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = produced_series(&health);
            if got == wanted || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    assert_eq!(
        got, wanted,
        "orderpipe_produced_records_total of the log relay"
    );
    // The published rows leave the table (the copy keeps them).
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&pool, "SELECT COUNT(*) FROM outbox_messages").await > 0 {
        assert!(
            Instant::now() < deadline,
            "published rows not deleted in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let summary = crate::outbox::stop(&mut relay);
    assert_eq!(summary["published"], rows, "{summary}");
    assert_eq!(summary["deleted"], rows, "{summary}");
}

/// A first start (no checkpoint, no `--start-position`) over a table the
/// polling relay left rows in: the unsent rows are published from a
/// consistent snapshot in the first checkpoint's transaction, rows marked
/// sent are not, and the stream continues from the snapshot's position
/// while writers go on: every row once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_start_publishes_the_unsent_rows_then_the_binlog_each_once() {
    let (env, pool) = log_env().await;
    let api = start_api(&env).await;
    drive_orders(&api, 30, 4).await;
    // The first 20 rows as if the polling relay had published them.
    sqlx::query("UPDATE outbox_messages SET sent_ms = 1 ORDER BY id LIMIT 20")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM outbox_copy ORDER BY id LIMIT 20")
        .execute(&pool)
        .await
        .unwrap();
    let unsent = count(
        &pool,
        "SELECT COUNT(*) FROM outbox_messages WHERE sent_ms IS NULL",
    )
    .await;
    let mut relay = relay_from(&env, "binlog", "first", &[]);
    // Writers while it starts, and after.
    let more = tokio::spawn({
        let api = api.clone();
        async move { drive_orders(&api, 30, 4).await }
    });
    more.await.unwrap();
    let written = written(&pool).await;
    assert_once_in_order(&env, &written, Duration::from_secs(60));
    let summary = crate::outbox::stop(&mut relay);
    let rows: usize = written.values().map(Vec::len).sum();
    assert_eq!(summary["published"], rows, "{summary}");
    assert!(
        rows as i64 > unsent && unsent >= 50,
        "{rows} rows, {unsent} unsent at start"
    );
}

/// 16 writers through the API while the active log relay is SIGKILLed five
/// times, each time at a moment it has just published, and a standby under
/// another name takes over from the checkpoint when the lease expires: every
/// event once, per order in order.
#[tokio::test(flavor = "multi_thread")]
async fn sigkilled_log_relays_fail_over_to_a_standby_and_lose_nothing_nor_repeat_anything() {
    kills_during_writes(5, 0).await;
}

/// The full size: ten SIGKILLs during a run of at least 100k outbox
/// rows from 16 writers.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "soak: the issue's full size (make test runs log_relay::sigkilled_log_relays_fail_over_to_a_standby_and_lose_nothing_nor_repeat_anything); run by `make soak`"]
async fn ten_sigkills_during_100k_outbox_rows_lose_nothing_nor_repeat_anything() {
    kills_during_writes(10, 100_000).await;
}

/// Writers run until `kills` SIGKILLs of the lease holder are done and the
/// outbox has had `min_rows` rows; then every event is checked once, in order.
async fn kills_during_writes(kills_wanted: usize, min_rows: i64) {
    let (env, pool) = log_env().await;
    let start = binlog_end(&pool).await;
    let api = start_api(&env).await;
    // The writers go on until the last kill.
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writers = tokio::spawn({
        let writing = writing.clone();
        async move {
            let mut events = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                events += drive_orders(&api, 100, 16).await;
            }
            events
        }
    });
    let order_topic = env.settings.topics.order_events.name.clone();
    let spawn = |n: usize| {
        let name = format!("relay-{n}");
        (
            name.clone(),
            log_relay(
                &env,
                &name,
                &["--start-position", &start, "--lease-ttl", "2"],
            ),
        )
    };
    let mut relays: BTreeMap<String, Spawned> = BTreeMap::from([spawn(0), spawn(1)]);
    let mut next = 2;
    let mut kills = 0;
    let every = (min_rows / kills_wanted as i64).max(1);
    while kills < kills_wanted {
        // Spread the kills over the run's rows.
        while count(&pool, "SELECT COUNT(*) FROM outbox_copy").await < every * kills as i64 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The lease holder, once it has published more than before.
        let before = end_offsets(&env, &order_topic);
        let deadline = Instant::now() + Duration::from_secs(60);
        let holder = loop {
            assert!(Instant::now() < deadline, "no relay published for 60 s");
            let holder: Option<(String,)> = sqlx::query_as(
                "SELECT owner FROM relay_source_leases WHERE expires_ms > UNIX_TIMESTAMP(NOW(3)) * 1000",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            if let Some((holder,)) = holder
                && relays.contains_key(&holder)
                && end_offsets(&env, &order_topic) > before
            {
                break holder;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // A moment into its next batch, not at a round point.
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 40)).await;
        let mut killed = relays.remove(&holder).unwrap();
        killed.kill().unwrap();
        let _ = killed.wait();
        kills += 1;
        let (name, standby) = spawn(next);
        relays.insert(name, standby);
        next += 1;
    }
    while count(&pool, "SELECT COUNT(*) FROM outbox_copy").await < min_rows {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let events = writers.await.unwrap();
    eprintln!("{kills} SIGKILLs of the lease holder during {events} events");
    let written = written(&pool).await;
    assert_once_in_order(&env, &written, Duration::from_secs(120));
    for (_, mut relay) in relays {
        let _ = crate::outbox::stop(&mut relay);
    }
}

/// Sum of the high watermarks of `topic`.
fn end_offsets(env: &TestEnv, topic: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer =
        orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
            .create()
            .unwrap();
    let Ok(metadata) = client.fetch_metadata(Some(topic), Duration::from_secs(10)) else {
        return 0;
    };
    metadata.topics()[0]
        .partitions()
        .iter()
        .filter_map(|p| {
            client
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .ok()
        })
        .map(|(_, high)| high)
        .sum()
}

/// `--source binlog` refuses the polling relay's crash hook, naming it; a bad
/// `--source` names the accepted values.
#[tokio::test(flavor = "multi_thread")]
async fn bad_log_relay_flags_name_the_flag_and_the_choices() {
    let env = TestEnv::new();
    let run = env.cli(&[
        "relay",
        "--source",
        "binlog",
        "--crash-at",
        "before-kafka-commit",
    ]);
    let text = run.failure();
    assert!(
        text.contains("--crash-at") && text.contains("--source poll"),
        "{text}"
    );
    let text = env.cli(&["relay", "--source", "wal"]).failure();
    assert!(
        text.contains("auto") && text.contains("binlog") && text.contains("poll"),
        "{text}"
    );
}

/// `auto` polls, with a warning that says why, when the binlog cannot be
/// read: here a SQLite database, which has none.
#[tokio::test(flavor = "multi_thread")]
async fn auto_falls_back_to_polling_and_says_why() {
    let mut env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/outbox.db?mode=rwc", dir.path().display());
    env.set_env("ORDERPIPE_DATABASE__URL", &url);
    let run = env.cli(&[
        "relay",
        "--source",
        "auto",
        "--instance",
        "auto",
        "--migrate",
        "--until-idle",
        "1",
    ]);
    run.success();
    let text = run.text();
    assert!(
        text.contains("polling the outbox table, because the binlog is not usable")
            && text.contains("not a mysql:// URL"),
        "{text}"
    );
}

/// The relay's deletes of published rows log each row's primary key alone
/// (`binlog_row_image = MINIMAL` for the statement), so the outbox costs the
/// binlog its inserts only; a database user without BINLOG ADMIN falls
/// back to deletes that log the whole row, and still deletes. The oracle is
/// MariaDB's own rendering of its binlog (`mariadb-binlog --verbose`): the
/// columns each delete logged, against the table's columns in
/// information_schema.
#[tokio::test(flavor = "multi_thread")]
async fn published_rows_leave_only_their_key_in_the_binlog_or_the_whole_row_without_binlog_admin() {
    let (mut env, pool) = log_env().await;
    let database = format!("op_{}", env.prefix);
    let (columns,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = ? AND table_name = 'outbox_messages'",
    )
    .bind(&database)
    .fetch_one(&pool)
    .await
    .unwrap();
    let api = start_api(&env).await;

    // The stack's user holds every privilege, BINLOG ADMIN among them.
    let from = binlog_end(&pool).await;
    drive_orders(&api, 10, 2).await;
    let written = count(&pool, "SELECT COUNT(*) FROM outbox_copy").await;
    env.cli(&[
        "relay",
        "--source",
        "binlog",
        "--instance",
        "admin",
        "--start-position",
        &from,
        "--until-idle",
        "1",
    ])
    .success();
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM outbox_messages").await,
        0
    );
    let images = delete_images(&from, &database);
    assert_eq!(
        images.len() as i64,
        written,
        "one delete per row: {images:?}"
    );
    assert!(images.iter().all(|&n| n == 1), "the key alone: {images:?}");

    // A user with the rights a log relay needs, and not BINLOG ADMIN.
    let user = database.clone();
    let grants = [
        format!("CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'relay'"),
        format!("GRANT ALL ON `{database}`.* TO '{user}'@'127.0.0.1'"),
        format!("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'"),
    ];
    for grant in &grants {
        sqlx::query(AssertSqlSafe(grant.as_str()))
            .execute(&pool)
            .await
            .unwrap();
    }
    let port = mariadb_port();
    env.set_env(
        "ORDERPIPE_DATABASE__URL",
        &format!("mysql://{user}:relay@127.0.0.1:{port}/{database}"),
    );
    env.set_env("RUST_LOG", "info");
    let from = binlog_end(&pool).await;
    drive_orders(&api, 10, 2).await;
    let more = count(&pool, "SELECT COUNT(*) FROM outbox_copy").await - written;
    let run = env.cli(&[
        "relay",
        "--source",
        "binlog",
        "--instance",
        "plain",
        "--until-idle",
        "1",
    ]);
    let text = run.text();
    sqlx::query(AssertSqlSafe(format!("DROP USER '{user}'@'127.0.0.1'")))
        .execute(&pool)
        .await
        .unwrap();
    run.success();
    assert!(
        text.contains("deletes of published outbox rows log the whole row"),
        "says why: {text}"
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM outbox_messages").await,
        0,
        "{text}"
    );
    let images = delete_images(&from, &database);
    assert_eq!(images.len() as i64, more, "one delete per row: {images:?}");
    assert!(
        images.iter().all(|&n| n as i64 == columns),
        "{columns} columns each: {images:?}"
    );
}

/// For each delete of `database`.outbox_messages in the binlog from `from`
/// (`FILE:POS`) to its end, how many columns it logged, as
/// `mariadb-binlog --verbose` renders them.
fn delete_images(from: &str, database: &str) -> Vec<usize> {
    let (file, position) = from.split_once(':').unwrap();
    let port = mariadb_port();
    let out = std::process::Command::new("mariadb-binlog")
        .args([
            "--no-defaults",
            "--read-from-remote-server",
            "--host=127.0.0.1",
            "--user=orderpipe",
            "--password=orderpipe",
        ])
        .arg(format!("--port={port}"))
        .arg(format!("--start-position={position}"))
        .args([
            "--to-last-log",
            "--verbose",
            "--base64-output=DECODE-ROWS",
            file,
        ])
        .output()
        .expect("mariadb-binlog runs");
    assert!(out.status.success(), "mariadb-binlog: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let delete = format!("### DELETE FROM `{database}`.`outbox_messages`");
    let mut images = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if line == delete {
            images.extend(current.replace(0));
        } else if line.starts_with("###   @") {
            if let Some(n) = current.as_mut() {
                *n += 1;
            }
        } else if line != "### WHERE" {
            images.extend(current.take());
        }
    }
    images.extend(current);
    images
}
