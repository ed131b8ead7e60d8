//! Operator safety nets (issue 11, item 6): bulk DLQ commands without a
//! terminal, `config --output` round trips, the database pool against the
//! partition workers, and names longer than their columns.

use std::time::Duration;

use crate::helpers::TestEnv;

async fn statuses(env: &TestEnv) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT status, COUNT(*) FROM dead_letters GROUP BY status ORDER BY status")
        .fetch_all(&env.db().pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn bulk_dlq_commands_without_a_terminal_need_yes() {
    let env = TestEnv::new().with_database().await;
    let group = "operator.bulk";
    crate::replay::dead_letters(&env, group, 0..5, 1).await;
    let pending = vec![("pending".to_string(), 5)];

    // `cli` runs with stdin from /dev/null: no terminal.
    for args in [
        vec!["dlq", "replay", "--group", group],
        vec!["dlq", "ignore", "--group", group, "--reason", "load test"],
        vec![
            "dlq",
            "ignore",
            "--status",
            "pending",
            "--reason",
            "load test",
        ],
    ] {
        let out = env.cli(&args).failure();
        assert!(
            out.contains("--yes") && out.contains("5 now") && out.contains("nothing changed"),
            "{args:?}: {out}"
        );
        assert_eq!(statuses(&env).await, pending, "{args:?} changed rows");
    }

    // Named rows are explicit: they run without --yes.
    let first: (i64,) = sqlx::query_as("SELECT MIN(id) FROM dead_letters")
        .fetch_one(&env.db().pool)
        .await
        .unwrap();
    env.cli(&[
        "dlq",
        "ignore",
        "--id",
        &first.0.to_string(),
        "--reason",
        "one",
    ])
    .success();
    assert_eq!(
        statuses(&env).await,
        vec![("ignored".to_string(), 1), ("pending".to_string(), 4)]
    );

    // With --yes the filter runs.
    env.cli(&[
        "dlq",
        "ignore",
        "--group",
        group,
        "--status",
        "pending",
        "--reason",
        "load test",
        "--yes",
    ])
    .success();
    assert_eq!(statuses(&env).await, vec![("ignored".to_string(), 5)]);
}

/// `orderpipe [--config FILE] config --output FORMAT`.
fn print_config(
    env: &TestEnv,
    format: &str,
    file: Option<&std::path::Path>,
) -> crate::helpers::CliRun {
    let path = file.map(|f| f.to_str().unwrap().to_string());
    let mut args = Vec::new();
    if let Some(path) = &path {
        args.extend(["--config", path.as_str()]);
    }
    args.extend(["config", "--output", format]);
    env.cli(&args)
}

#[tokio::test(flavor = "multi_thread")]
async fn config_output_is_a_file_the_binary_reads_back_with_secrets_redacted() {
    let mut env = TestEnv::new().with_database().await;
    env.set_env("ORDERPIPE_KAFKA__SASL_PASSWORD", "kafka-s3cret");
    env.set_env("ORDERPIPE_DATABASE__MAX_CONNECTIONS", "7");
    let dir = tempfile::tempdir().unwrap();
    for format in ["toml", "json"] {
        let printed = print_config(&env, format, None).success();
        assert!(
            !printed.contains("kafka-s3cret") && !printed.contains("orderpipe:orderpipe@"),
            "{printed}"
        );
        assert!(printed.contains("__REDACTED__"), "{printed}");
        let file = dir.path().join(format!("orderpipe.{format}"));
        std::fs::write(&file, &printed).unwrap();

        // Read back with the secrets from the environment: the same document,
        // and a command that uses the database works.
        let again = print_config(&env, format, Some(&file)).success();
        let as_json = |text: &str| -> serde_json::Value {
            match format {
                "toml" => {
                    serde_json::to_value(toml::from_str::<toml::Value>(text).unwrap()).unwrap()
                }
                _ => serde_json::from_str(text).unwrap(),
            }
        };
        let document = as_json(&printed);
        assert_eq!(as_json(&again), document, "{format}");
        assert_eq!(document["database"]["max_connections"], 7, "{document}");
        assert_eq!(
            document["topics"]["order_events"]["name"],
            env.settings.topics.order_events.name.as_str()
        );
        env.cli(&["--config", file.to_str().unwrap(), "dlq", "stats"])
            .success();

        // Read back without them: the placeholder is refused, naming the field.
        let mut bare = env.command(&["--config", file.to_str().unwrap(), "dlq", "stats"]);
        bare.env_remove("ORDERPIPE_DATABASE__URL")
            .env_remove("ORDERPIPE_KAFKA__SASL_PASSWORD");
        let out = bare.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "placeholder accepted as a secret ({format})"
        );
        assert!(
            text.contains("__REDACTED__")
                && (text.contains("database.url") || text.contains("kafka.sasl_password")),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_longer_than_its_column_is_refused_at_start() {
    let env = TestEnv::new();
    let group = "g".repeat(orderpipe::db::CONSUMER_GROUP_CHARS + 1);
    let out = env
        .cli(&[
            "consume",
            "--group",
            &group,
            "--handler",
            "inventory",
            "--until-idle",
            "1",
        ])
        .failure();
    assert!(
        out.contains("256 characters")
            && out.contains("the limit is 255")
            && out.contains("consumer_group"),
        "{out}"
    );
    // At the limit it is not refused for its length.
    let out = env
        .cli(&[
            "consume",
            "--group",
            &"g".repeat(255),
            "--handler",
            "inventory",
            "--until-idle",
            "1",
        ])
        .text();
    assert!(!out.contains("the limit is 255"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_pooled_mariadb_session_is_strict() {
    use sqlx::Connection;
    let env = TestEnv::new().with_database().await;
    let db = env.db();
    for _ in 0..3 {
        let (mode,): (String,) = sqlx::query_as("SELECT @@SESSION.sql_mode")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(mode.contains("STRICT_TRANS_TABLES"), "{mode}");
    }
    // A server configured with sql_mode = '' (the session starts lenient).
    let url = secrecy::ExposeSecret::expose_secret(&env.settings.database.url).to_string();
    let mut lenient = sqlx::MySqlConnection::connect(&url).await.unwrap();
    sqlx::query("SET SESSION sql_mode = ''")
        .execute(&mut lenient)
        .await
        .unwrap();
    sqlx::query(orderpipe::db::STRICT_SESSION)
        .execute(&mut lenient)
        .await
        .unwrap();
    let (mode,): (String,) = sqlx::query_as("SELECT @@SESSION.sql_mode")
        .fetch_one(&mut lenient)
        .await
        .unwrap();
    assert!(mode.contains("STRICT_TRANS_TABLES"), "{mode}");
}

/// A downstream that answers `{"code": 0}` after `delay`, counting requests.
async fn slow_downstream(
    delay: std::time::Duration,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                tokio::time::sleep(delay).await;
                counter.fetch_add(1, Ordering::SeqCst);
                axum::Json(serde_json::json!({"code": 0}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_configured_below_the_partition_workers_is_raised_and_the_database_never_reads_down()
{
    use std::io::BufRead;
    let mut env = TestEnv::new().with_database().await;
    // Every delivery holds its worker's connection (the HTTP call runs in the
    // batch's transaction) for 400 ms; 12 partitions, 3 records each: with 2
    // connections, workers would queue past the 5 s acquire timeout.
    let (url, delivered) = slow_downstream(std::time::Duration::from_millis(400)).await;
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(
        config.path(),
        format!("[[http.subscriptions]]\nname = \"pool\"\nevents = [\"order.*\"]\nurl = \"{url}\"\ntimeout_ms = 5000\n"),
    )
    .unwrap();
    let config_path = config.path().to_str().unwrap();
    env.set_env("ORDERPIPE_DATABASE__MAX_CONNECTIONS", "2");
    env.cli(&["--config", config_path, "topics", "ensure"])
        .success();
    let events = 36;
    env.cli(&[
        "produce",
        "--count",
        &events.to_string(),
        "--orders",
        "36",
        "--seed",
        "3",
        "--first-order-id",
        "1",
    ])
    .success();

    let mut child = env.spawn(&[
        "--config",
        config_path,
        "deliver",
        "--subscription",
        "pool",
        "--until-idle",
        "4",
        "--health-addr",
        "127.0.0.1:0",
        "--output",
        "json",
    ]);
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    let addr = loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("health endpoint announced");
        log.push(line.clone());
        if let Some(rest) = line.strip_prefix("health endpoints on http://") {
            break rest.trim_end_matches("/health/ready").to_string();
        }
    };
    let mut db_errors = Vec::new();
    while child.try_wait().unwrap().is_none() {
        let (_, body) = crate::helpers::http_get(&addr, "/health/ready");
        if body.contains("database unavailable") && !body.contains("not yet reached") {
            db_errors.push(body);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    log.extend(rx.try_iter());
    let log = log.join("\n");
    assert!(status.success(), "{log}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        db_errors.is_empty(),
        "readiness reported the database down: {db_errors:?}\n{log}"
    );
    assert_eq!(summary["apply_failures"], 0, "{summary}\n{log}");
    assert_eq!(summary["applied"], events, "{summary}");
    assert_eq!(delivered.load(std::sync::atomic::Ordering::SeqCst), events);
    assert!(log.contains("the pool is raised to 26"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_longer_than_its_columns_is_dead_lettered_and_persisted_whole_and_never_parked() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let env = TestEnv::new().with_database().await;
    let group = "operator.longkey";
    env.cli(&["topics", "ensure", "--group", group]).success();
    let topic = env.settings.topics.order_events.name.clone();
    let codec = env.order_events_codec();
    let event = orderpipe::harness::generator::LifecycleGenerator::new("checkout", 1, 1, 5)
        .next()
        .unwrap();
    let value = codec.encode(&event).await.unwrap();
    // Longer than record_key (255 characters) and dead_letters.record_key
    // before migration 0006 (1,024 bytes); an event_name header longer than
    // its 128-character column.
    let key = "7".repeat(2_000);
    let long_name = "n".repeat(200);
    let headers = OwnedHeaders::new().insert(Header {
        key: "event_name",
        value: Some(&long_name),
    });
    let producer: FutureProducer =
        orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
            .create()
            .unwrap();
    producer
        .send(
            FutureRecord::to(&topic)
                .key(&key)
                .payload(&value)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .unwrap();

    let summary = crate::consumer::consume(&env, group, "inventory");
    assert_eq!(summary["dead_lettered"], 1, "{summary}");
    assert_eq!(summary["applied"], 0, "{summary}");
    let dead = env.read(
        &env.settings.topics.dead_letter.name,
        1,
        Duration::from_secs(20),
    );
    assert_eq!(
        rdkafka::Message::key(&dead[0]),
        Some(key.as_bytes()),
        "the dead letter keeps the whole key"
    );
    let (parked,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM parked_keys")
        .fetch_one(&env.db().pool)
        .await
        .unwrap();
    assert_eq!(
        parked, 0,
        "a key cut to the column's 255 characters was parked"
    );

    // The persister stores it whole (under strict mode a too-long value
    // would fail the batch, retried forever).
    let mut persister = env.spawn(&["dlq", "persist", "--until-idle", "3", "--output", "json"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while persister.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the persister did not finish within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(persister.wait().unwrap().success());
    let (stored, name, class): (Vec<u8>, Option<String>, String) =
        sqlx::query_as("SELECT record_key, event_name, error_class FROM dead_letters")
            .fetch_one(&env.db().pool)
            .await
            .unwrap();
    assert_eq!(
        stored,
        key.as_bytes(),
        "dead_letters.record_key is not the whole key"
    );
    assert_eq!(
        name, None,
        "an event_name longer than its column is not a valid name"
    );
    assert_eq!(class, "invalid_key");
}

/// A plain start with the default settings warns about nothing: the pool
/// is sized to the partition workers when `database.max_connections` is
/// unset (it used to warn that the default 16 was below their 25).
///
/// Only orderpipe's own warnings count. librdkafka's report the broker's
/// passing state, which this test does not control: a broker not ready to
/// hand out producer ids answers "Coordinator load in progress", and the
/// client warns and retries (seen in CI and on a just-started broker,
/// 2026-12-06).
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_started_with_default_settings_prints_no_warning() {
    let env = TestEnv::new().with_database().await;
    let group = "quiet-service.order.consumer";
    env.cli(&["topics", "ensure", "--group", group]).success();
    let run = env.cli(&[
        "consume",
        "--group",
        group,
        "--handler",
        "notification",
        "--until-idle",
        "2",
    ]);
    run.success();
    let text = run.text();
    let own_warnings: Vec<&str> = text
        .lines()
        .filter(|line| {
            line.split_once(" WARN ")
                .is_some_and(|(_, rest)| !rest.starts_with("librdkafka:"))
        })
        .collect();
    assert!(
        own_warnings.is_empty(),
        "a default start warned: {own_warnings:#?}\n{text}"
    );
}
