//! Shared test plumbing: a fresh namespace per test, the CLI as a
//! subprocess, and a reader that drains a topic.

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use orderpipe::config::Settings;
use orderpipe::kafka::client::client_config;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};

/// One test's view of the stack: settings with its own topic names, and
/// the same settings as `ORDERPIPE_*` variables for the CLI.
pub struct TestEnv {
    /// Unique prefix of this test's topics.
    pub prefix: String,
    /// Settings pointing at the dev stack with this test's topics.
    pub settings: Settings,
    env: BTreeMap<String, String>,
}

impl TestEnv {
    /// The Confluent-framed codec of this test's order events topic (the
    /// schema registered on first use).
    pub fn order_events_codec(&self) -> orderpipe::codec::Codec {
        orderpipe::codec::Codec::new(
            &self.settings.registry,
            &self.settings.topics.order_events.name,
            orderpipe::schema::SchemaCatalog::embedded().order_events(),
            true,
        )
        .expect("order events codec")
    }

    /// A fresh namespace on the dev stack.
    pub fn new() -> Self {
        let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let mut settings = Settings::load(None).expect("settings load");
        let mut env = BTreeMap::new();
        TEST_STACK.point_at(&mut settings, &mut env);
        for (key, spec) in [
            ("ORDER_EVENTS", &mut settings.topics.order_events),
            ("INVENTORY_EVENTS", &mut settings.topics.inventory_events),
            ("DEAD_LETTER", &mut settings.topics.dead_letter),
        ] {
            spec.name = format!("{prefix}.{}", spec.name);
            env.insert(format!("ORDERPIPE_TOPICS__{key}__NAME"), spec.name.clone());
        }
        // Most relay tests are the polling relay's (crash hooks, --until-idle
        // over a filled table); the log relay's tests pass --source binlog.
        env.insert("ORDERPIPE_OUTBOX__SOURCE".into(), "poll".into());
        settings.outbox.source = orderpipe::outbox::OutboxSource::Poll;
        // Relays of parallel tests share the broker: their shards' transactional ids must differ.
        env.insert(
            "ORDERPIPE_PRODUCER__TRANSACTIONAL_ID_PREFIX".into(),
            format!("{prefix}-relay"),
        );
        Self {
            prefix,
            settings,
            env,
        }
    }

    /// Creates a fresh database for this test, migrated, and points the
    /// settings and the CLI at it.
    pub async fn with_database(mut self) -> Self {
        let url = empty_mysql_database(&format!("op_{}", self.prefix)).await;
        self.settings.database.url = url.clone().into();
        self.set_env("ORDERPIPE_DATABASE__URL", &url);
        let db = orderpipe::db::Db::connect(&self.settings.database, 2).unwrap();
        db.migrate().await.unwrap();
        self
    }

    /// Names `orderpipe cdc`'s connector, topics and offsets topic after
    /// this test's prefix (`<prefix>.cdc.<db>.<table>`, 3 partitions).
    pub fn with_cdc(mut self) -> Self {
        let prefix = self.prefix.clone();
        self.set_env("ORDERPIPE_CDC__NAME", &prefix);
        self.set_env("ORDERPIPE_CDC__TOPIC_PREFIX", &format!("{prefix}.cdc"));
        self.set_env(
            "ORDERPIPE_CDC__OFFSETS_TOPIC",
            &format!("{prefix}.cdc.offsets"),
        );
        self.set_env("ORDERPIPE_CDC__PARTITIONS", "3");
        self
    }

    /// An admin client of the dev stack's broker (for changes an operator
    /// would make by hand).
    pub fn admin(&self) -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
        client_config(&self.settings.kafka.client_options())
            .create()
            .expect("admin client")
    }

    /// This test's database (after [`TestEnv::with_database`]).
    pub fn db(&self) -> orderpipe::db::Db {
        orderpipe::db::Db::connect(&self.settings.database, 4).unwrap()
    }

    /// Starts `orderpipe ARGS` in the background with this test's
    /// environment; killed when dropped, so a failing test leaves no process.
    pub fn spawn(&self, args: &[&str]) -> Spawned {
        Spawned(
            self.command(args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("orderpipe starts"),
        )
    }

    /// Sets a config value for the CLI through the environment.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.insert(key.to_string(), value.to_string());
    }

    /// `orderpipe ARGS` with this test's environment, not yet started.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_of(env!("CARGO_BIN_EXE_orderpipe"), args)
    }

    /// `PROGRAM ARGS` (another orderpipe binary, e.g. the release image's)
    /// with this test's environment, not yet started.
    pub fn command_of(&self, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        // `warn` unless the test set RUST_LOG (to wait for an info line).
        command.args(args).env("RUST_LOG", "warn").envs(&self.env);
        command
    }

    /// Runs `orderpipe ARGS` with this test's environment.
    pub fn cli(&self, args: &[&str]) -> CliRun {
        let started = Instant::now();
        let output = self.command(args).output().expect("orderpipe runs");
        CliRun {
            output,
            elapsed: started.elapsed(),
        }
    }

    /// Reads `count` records of `topic` from the beginning (all partitions),
    /// failing the test if they do not arrive within `timeout`.
    pub fn read(&self, topic: &str, count: usize, timeout: Duration) -> Vec<OwnedMessage> {
        let consumer: BaseConsumer = client_config(&self.settings.kafka.client_options())
            .set("group.id", format!("{}-reader", self.prefix))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let partitions = metadata.topics()[0].partitions().len() as i32;
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).expect("assign");
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            assert!(
                Instant::now() < deadline,
                "read only {} of {count} records of {topic} within {timeout:?}",
                out.len()
            );
            if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                out.push(message.expect("consume").detach());
            }
        }
        // Nothing beyond what was expected.
        if let Some(Ok(extra)) = consumer.poll(Duration::from_secs(1)) {
            panic!(
                "unexpected extra record at offset {} of {topic}",
                extra.offset()
            );
        }
        out
    }
}

/// A replication server id for a `cdc` of this test: replicas of parallel
/// tests need distinct ones.
pub fn cdc_server_id() -> String {
    (10_000 + rand::random::<u32>() % 1_000_000_000).to_string()
}

/// The dev stack's MariaDB as the orderpipe user (which may create databases).
pub static MYSQL_ADMIN_URL: StackUrl = StackUrl(LazyLock::new(|| {
    format!("mysql://orderpipe:orderpipe@127.0.0.1:{}/", mariadb_port())
}));

/// The port of the stack's MariaDB on 127.0.0.1.
pub fn mariadb_port() -> u16 {
    TEST_STACK.port("MARIADB_PORT", 3306)
}

/// A URL of the stack the tests use, known once the environment is read:
/// formats (`format!("{MYSQL_ADMIN_URL}{db}")`) and derefs to `&str`.
pub struct StackUrl(LazyLock<String>);

impl std::ops::Deref for StackUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StackUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which dev stack the tests use: the shared one (`dev/stack.sh`'s
/// defaults: Kafka :9092, registry :8081, MariaDB :3306, state in
/// `.stack`) unless `OPTEST_<X>` variables name another, where `<X>` is
/// one of `dev/stack.sh`'s `ORDERPIPE_<X>` knobs below (docs/testing.md).
/// Not `ORDERPIPE_*` themselves: the CLI would read those as settings.
/// Read here only, applied in [`TestEnv::new`], [`MYSQL_ADMIN_URL`] and
/// [`stack`].
pub struct TestStack {
    /// `(X, value)` of each `OPTEST_<X>` set.
    knobs: Vec<(&'static str, String)>,
}

/// The knobs of `dev/stack.sh` a test stack may set.
const STACK_KNOBS: [&str; 6] = [
    "STACK_DIR",
    "KAFKA_PORT",
    "KAFKA_CONTROLLER_PORT",
    "REGISTRY_PORT",
    "REGISTRY_MGMT_PORT",
    "MARIADB_PORT",
];

/// The stack of this test run, read once from the environment.
pub static TEST_STACK: LazyLock<TestStack> = LazyLock::new(|| TestStack {
    knobs: STACK_KNOBS
        .iter()
        .filter_map(|&knob| {
            std::env::var(format!("OPTEST_{knob}"))
                .ok()
                .map(|v| (knob, v))
        })
        .collect(),
});

impl TestStack {
    /// The port `OPTEST_<knob>` sets, or the shared stack's.
    fn port(&self, knob: &str, shared: u16) -> u16 {
        self.knobs
            .iter()
            .find(|(k, _)| *k == knob)
            .map_or(shared, |(_, v)| {
                v.parse()
                    .unwrap_or_else(|_| panic!("OPTEST_{knob}={v:?} is not a port"))
            })
    }

    fn is_set(&self, knob: &str) -> bool {
        self.knobs.iter().any(|(k, _)| *k == knob)
    }

    /// Points a test's settings, and the CLI's environment, at this stack's
    /// Kafka, registry and MariaDB (only where they differ from the defaults).
    fn point_at(&self, settings: &mut Settings, env: &mut BTreeMap<String, String>) {
        if self.is_set("KAFKA_PORT") {
            let servers = format!("127.0.0.1:{}", self.port("KAFKA_PORT", 9092));
            settings.kafka.bootstrap_servers = servers.clone();
            env.insert("ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS".into(), servers);
        }
        if self.is_set("REGISTRY_PORT") {
            let url = format!(
                "http://127.0.0.1:{}/apis/ccompat/v7",
                self.port("REGISTRY_PORT", 8081)
            );
            settings.registry.url = url.clone();
            env.insert("ORDERPIPE_REGISTRY__URL".into(), url);
        }
        if self.is_set("MARIADB_PORT") {
            let url = format!("{MYSQL_ADMIN_URL}orderpipe");
            settings.database.url = url.clone().into();
            env.insert("ORDERPIPE_DATABASE__URL".into(), url);
        }
    }
}

/// A background `orderpipe` process, killed (if still running) on drop.
pub struct Spawned(pub std::process::Child);

impl std::ops::Deref for Spawned {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Spawned {
    /// Stops the process if it still runs and returns its exit status and
    /// what it printed (the streams nobody else took): for the message of a
    /// failing test, so a flaky run explains itself.
    pub fn stop_and_output(&mut self) -> String {
        kill_and_output(&mut self.0)
    }
}

/// [`Spawned::stop_and_output`] for a bare child.
pub fn kill_and_output(child: &mut std::process::Child) -> String {
    use std::io::Read;
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
    }
    let status = child
        .wait()
        .map(|s| s.to_string())
        .unwrap_or_else(|e| e.to_string());
    let mut printed = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut printed);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut printed);
    }
    // The end is what explains a stall; keep the last 8 KB.
    let tail = printed.len().saturating_sub(8 * 1024);
    let tail = printed.ceil_char_boundary(tail);
    format!("{status}; printed:\n{}", &printed[tail..])
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A finished CLI run.
pub struct CliRun {
    /// Exit status and captured streams.
    pub output: Output,
    /// Wall time.
    pub elapsed: Duration,
}

impl CliRun {
    /// stdout + stderr, for assertions and failure messages.
    pub fn text(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.output.stdout),
            String::from_utf8_lossy(&self.output.stderr)
        )
    }

    /// Asserts success and returns stdout.
    pub fn success(&self) -> String {
        assert!(
            self.output.status.success(),
            "orderpipe failed:\n{}",
            self.text()
        );
        String::from_utf8_lossy(&self.output.stdout).to_string()
    }

    /// Asserts failure and returns stdout + stderr.
    pub fn failure(&self) -> String {
        assert!(
            !self.output.status.success(),
            "orderpipe unexpectedly succeeded:\n{}",
            self.text()
        );
        self.text()
    }
}

/// A header of a record as text.
pub fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    use rdkafka::message::Headers;
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).to_string()))
    })
}

/// The dev stack's control script.
pub const STACK_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dev/stack.sh");

/// Runs `dev/stack.sh ARGS` (stop/start a service of the dev stack) on
/// the stack the tests use ([`TestStack`]).
pub fn stack(args: &[&str]) {
    let knobs = TEST_STACK
        .knobs
        .iter()
        .map(|(k, v)| (format!("ORDERPIPE_{k}"), v));
    let status = Command::new(STACK_SCRIPT)
        .args(args)
        .envs(knobs)
        .status()
        .expect("dev/stack.sh runs");
    assert!(status.success(), "dev/stack.sh {args:?} failed");
}

/// Reads the child's stderr until it announces its health endpoint; the
/// rest of stderr keeps draining in a thread (so the child never blocks).
pub fn health_addr(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.strip_prefix("health endpoints on http://") {
                let _ = tx.send(rest.trim_end_matches("/health/ready").to_string());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("health endpoint announced")
}

/// Polls `GET path` until it answers `status` with a body containing
/// `needle` ("" for any) and returns the body; fails after `timeout` with
/// the last answer. A health state is waited for, never sampled once: on a
/// loaded machine it may change a moment later than on a quiet one.
pub fn wait_for_status(
    addr: &str,
    path: &str,
    status: u16,
    needle: &str,
    timeout: Duration,
) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let (got, body) = http_get(addr, path);
        if got == status && body.contains(needle) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} answered {got} after {timeout:?}, not {status} with `{needle}`: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The value of `series` (an exact `name{labels}`) on `/metrics`, if exported.
pub fn metric(addr: &str, series: &str) -> Option<f64> {
    let (_, body) = http_get(addr, "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
}

/// A plain HTTP/1.1 GET; returns (status, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

/// Waits until the broker's metadata holds `topic`: CreateTopics answers
/// when the controller has the topic, and a broker's metadata catches up
/// after it (cdc creates its topics at start-up, tests with an admin client).
pub fn wait_for_topic(env: &TestEnv, topic: &str) {
    let consumer: BaseConsumer =
        orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
            .create()
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .unwrap();
        if metadata
            .topics()
            .first()
            .is_some_and(|t| t.error().is_none() && !t.partitions().is_empty())
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} not in the broker's metadata within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The dedup id of consumer group `name` in `db`, registered as a consumer
/// registers it: for tests that write dedup rows by hand (`event_dedup`
/// keys on it and on the event id's 16 bytes, `UNHEX(REPLACE(?, '-', ''))`).
pub async fn dedup_group(db: &orderpipe::db::Db, name: &str) -> i64 {
    orderpipe::dedup::group(db, name).await.unwrap().id
}

/// The one integer a query of `db` returns (a count, a sum).
pub async fn scalar(db: &orderpipe::db::Db, sql: &'static str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&db.pool).await.unwrap();
    n
}

/// The database at `url` migrated with the shipped `migrations` before
/// `first_left_out` (copies of the files), as a release before it left it.
pub async fn migrated_before(
    url: &str,
    migrations: &str,
    first_left_out: &str,
) -> orderpipe::db::Db {
    let settings = orderpipe::db::DatabaseSettings {
        url: url.to_string().into(),
        max_connections: Some(2),
    };
    let db = orderpipe::db::Db::connect(&settings, 2).unwrap();
    let before = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(migrations).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        if file.as_str() < first_left_out {
            std::fs::copy(&path, before.path().join(file)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(before.path())
        .await
        .unwrap()
        .run(&db.pool)
        .await
        .unwrap();
    db
}

/// A new, empty MariaDB database named `name` (no migration applied); its URL.
pub async fn empty_mysql_database(name: &str) -> String {
    let admin = sqlx::MySqlPool::connect(&MYSQL_ADMIN_URL)
        .await
        .expect("MariaDB reachable (make dev-up)");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .execute(&admin)
        .await
        .unwrap();
    format!("{MYSQL_ADMIN_URL}{name}")
}
