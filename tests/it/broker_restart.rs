//! The broker away for 10 s and started again under load: the order API, the relay, two consumer groups, `cdc`
//! on a table being written and the router delivering its changes to a
//! local endpoint all run through it. Afterwards nothing is lost, no change
//! is on a topic twice for a read_committed reader, and every process
//! recovered by itself: one that exits is restarted as an orchestrator
//! would, at most [`MAX_RESTARTS`] times (more is a crash loop, a failure).
//!
//! Two ways away: a crash (SIGKILL), run by `make test`, and a controlled
//! shutdown, run by hand (a single broker can lose a commit's markers in
//! it: see the test). It stops the stack's Kafka: serial.
//! `BROKER_RESTART_TRANSACTION_TIMEOUT_MS`
//! runs the relay and cdc with another `transaction.timeout.ms` (the
//! measurement of docs/operations.md, "Broker restarts").
//! `BROKER_RESTART_KAFKA_DEBUG` (e.g. `cgrp,fetch`) turns on librdkafka's
//! `debug` contexts in the consumers and the router, for a stall's cause.
//! A failure writes every process's whole stderr to files and names them.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::message::OwnedMessage;
use serde_json::Value;

use crate::consumer::{count_rows, sigterm};
use crate::exactly_once::{ALL_HANDLERS, assert_exactly_once};
use crate::helpers::{Spawned, header, stack};
use crate::outbox::{drive_orders, event_ids, outbox_events, read_settled};
use crate::router::{stderr_lines, wait_for_line};
use crate::router_cdc::{Platform, ROUTER_ARGS};

/// How long the broker stays down.
const OUTAGE: Duration = Duration::from_secs(10);

/// Restarts a process may need; one more is a crash loop.
const MAX_RESTARTS: usize = 3;

/// The two consumer groups applying the order events, after the test's
/// prefix (runs on one broker share no group).
const GROUPS: [&str; 2] = ["billing", "shipping"];

/// A process of the pipeline and its supervisor: restarted when it exits,
/// as Kubernetes restarts a container, its exits counted.
struct Supervised<'a> {
    label: &'static str,
    start: Box<dyn Fn() -> Spawned + 'a>,
    child: Spawned,
    /// stderr of each run, drained in the background.
    logs: Vec<Arc<Mutex<Vec<String>>>>,
    /// Each exit: its status and when, from the test's start.
    exits: Vec<String>,
}

impl<'a> Supervised<'a> {
    fn start(label: &'static str, start: impl Fn() -> Spawned + 'a) -> Self {
        let mut child = start();
        let log = stderr_lines(&mut child);
        Self::adopt(label, child, log, start)
    }

    /// Supervises an already running `child` whose stderr `log` drains.
    fn adopt(
        label: &'static str,
        child: Spawned,
        log: Arc<Mutex<Vec<String>>>,
        start: impl Fn() -> Spawned + 'a,
    ) -> Self {
        Self {
            label,
            start: Box::new(start),
            child,
            logs: vec![log],
            exits: Vec::new(),
        }
    }

    /// Restarts the process if it exited; fails the test past [`MAX_RESTARTS`].
    fn supervise(&mut self, since: Instant) {
        let Some(status) = self.child.try_wait().unwrap() else {
            return;
        };
        self.exits.push(format!(
            "{status} at {:.1} s",
            since.elapsed().as_secs_f64()
        ));
        assert!(
            self.exits.len() <= MAX_RESTARTS,
            "{} exited {} times, a crash loop: {:?}\n{}",
            self.label,
            self.exits.len(),
            self.exits,
            self.tail(60)
        );
        eprintln!("[supervisor] {} exited ({status}); restarted", self.label);
        self.child = (self.start)();
        self.logs.push(stderr_lines(&mut self.child));
    }

    /// Lines of every run's stderr containing each of `parts`.
    fn lines_with(&self, parts: &[&str]) -> usize {
        self.logs
            .iter()
            .map(|log| {
                log.lock()
                    .unwrap()
                    .iter()
                    .filter(|l| parts.iter().all(|p| l.contains(p)))
                    .count()
            })
            .sum()
    }

    /// The first line of any run containing each of `parts`.
    fn first_with(&self, parts: &[&str]) -> Option<String> {
        self.logs.iter().find_map(|log| {
            log.lock()
                .unwrap()
                .iter()
                .find(|l| parts.iter().all(|p| l.contains(p)))
                .cloned()
        })
    }

    /// The last `n` lines of each run, for a failure's message.
    fn tail(&self, n: usize) -> String {
        let runs: Vec<String> = self
            .logs
            .iter()
            .enumerate()
            .map(|(run, log)| {
                let log = log.lock().unwrap();
                let from = log.len().saturating_sub(n);
                format!("--- {} run {run}:\n{}", self.label, log[from..].join("\n"))
            })
            .collect();
        runs.join("\n")
    }
}

/// Every process of the pipeline under its supervisor.
struct Fleet<'a> {
    since: Instant,
    processes: Vec<Supervised<'a>>,
}

impl Fleet<'_> {
    fn supervise(&mut self) {
        for p in &mut self.processes {
            p.supervise(self.since);
        }
    }

    fn get(&self, label: &str) -> &Supervised<'_> {
        self.processes.iter().find(|p| p.label == label).unwrap()
    }

    /// Polls `probe` (Ok when the state is reached, Err(where it stands)
    /// otherwise), supervising the processes meanwhile; fails after
    /// `timeout` with the last answer and what the processes printed.
    async fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut probe: impl AsyncFnMut() -> Result<(), String>,
    ) -> Duration {
        let started = Instant::now();
        loop {
            self.supervise();
            let last = match probe().await {
                Ok(()) => return started.elapsed(),
                Err(last) => last,
            };
            if started.elapsed() > timeout {
                let tails: Vec<String> = self.processes.iter().map(|p| p.tail(30)).collect();
                let saved = self.save_logs();
                panic!(
                    "not {what} within {timeout:?}: {last}\n{}\nwhole logs: {saved}",
                    tails.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Writes each run's whole stderr to a file of a new directory; its path.
    fn save_logs(&self) -> String {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("broker-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for p in &self.processes {
            for (run, log) in p.logs.iter().enumerate() {
                let name = format!("{}-{run}.log", p.label.replace(' ', "-"));
                std::fs::write(dir.join(name), log.lock().unwrap().join("\n")).unwrap();
            }
        }
        dir.display().to_string()
    }

    /// Supervises the processes for `period` (the outage).
    async fn run_for(&mut self, period: Duration) {
        let until = Instant::now() + period;
        while Instant::now() < until {
            self.supervise();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `(change, id)` of each row change a body of the endpoint is about.
fn change_of(body: &Value) -> (String, i64) {
    let change = body["event_type"].as_str().unwrap_or_default();
    let change = change.rsplit('.').next().unwrap_or_default().to_string();
    (change, body["data"]["id"].as_i64().unwrap_or(-1))
}

/// `(change, id)` of a change record: its `event_name` header's last part, its key.
fn record_change(message: &OwnedMessage) -> (String, i64) {
    use rdkafka::Message;
    let name = header(message, "event_name").unwrap_or_default();
    let key = message
        .key()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    (
        name.rsplit('.').next().unwrap_or_default().to_string(),
        key.parse().unwrap_or(-1),
    )
}

/// The row changes the writer made by its `n`th transaction: each
/// transaction `i` (from 1) inserts row `i` and updates row `i - 1`.
fn written_changes(n: i64) -> BTreeSet<(String, i64)> {
    let inserts = (1..=n).map(|i| ("insert".to_string(), i));
    let updates = (1..n).map(|i| ("update".to_string(), i));
    inserts.chain(updates).collect()
}

/// Records read and how many of them repeat an event id already read.
fn duplicates(messages: &[OwnedMessage]) -> (usize, usize) {
    let ids = event_ids(messages);
    let distinct: BTreeSet<&String> = ids.iter().collect();
    (messages.len(), ids.len() - distinct.len())
}

/// The number a `SELECT COUNT(*)`-like `sql` answers (-1 when it fails).
async fn count(db: &orderpipe::db::Db, sql: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&db.pool)
        .await
        .unwrap_or((-1,));
    n
}

/// A consuming process (a group, the router), with librdkafka's `debug`
/// contexts of `BROKER_RESTART_KAFKA_DEBUG` if set.
fn spawn_consumer(env: &crate::helpers::TestEnv, args: &[&str]) -> Spawned {
    let mut command = env.command(args);
    if let Ok(contexts) = std::env::var("BROKER_RESTART_KAFKA_DEBUG") {
        command
            .env("ORDERPIPE_KAFKA__OPTIONS__DEBUG", contexts)
            .env("RUST_LOG", "warn,librdkafka=debug,orderpipe=info");
    }
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("orderpipe starts");
    Spawned(child)
}

/// How the broker goes away.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// SIGKILL, as a node failure or the OOM killer: no controlled shutdown.
    Crash,
    /// SIGTERM: the broker's controlled shutdown, as a rolling restart does.
    ControlledShutdown,
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: kills the shared Kafka; run by `make test` in the serial phase"]
async fn a_broker_crashed_for_10s_under_load_loses_nothing_duplicates_nothing_and_every_process_recovers()
 {
    broker_away_for_10s_under_load(Outage::Crash).await;
}

/// A single broker's controlled shutdown can drop the commit markers of a
/// transaction it has just acknowledged: its partitions have no leader while
/// it shuts down, and the transaction coordinator skips markers for
/// partitions without one (KAFKA-5202's rule for deleted topics). Replicated
/// topics move leadership instead. So this fails about 1 run in 3 on the
/// single-broker dev stack, as it should (docs/operations.md).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "manual: stops the shared Kafka; fails about 1 run in 3 on a single broker (docs/testing.md); run: cargo test --features harness --test it -- --ignored broker_restart::a_broker_stopped"]
async fn a_broker_stopped_for_10s_under_load_loses_nothing_duplicates_nothing_and_every_process_recovers()
 {
    broker_away_for_10s_under_load(Outage::ControlledShutdown).await;
}

async fn broker_away_for_10s_under_load(outage: Outage) {
    let started = Instant::now();
    let transaction_timeout = std::env::var("BROKER_RESTART_TRANSACTION_TIMEOUT_MS").ok();
    let timeout_flag = transaction_timeout
        .as_ref()
        .map(|ms| format!("transaction.timeout.ms={ms}"));
    let mut timeout_args: Vec<&str> = Vec::new();
    if let Some(flag) = &timeout_flag {
        timeout_args.extend(["-X", flag]);
    }

    // cdc on table_user, the router's consumer of its inserts and updates.
    let platform = Platform::new().await;
    let hook = platform.consumer("hook", "ok", None).await;
    for change in ["insert", "update"] {
        platform.subscribe(&hook, change, "user", vec![]).await;
    }
    let Platform {
        source,
        cdc,
        seen,
        logs,
        ..
    } = platform;
    let env = &source.env;
    let groups = GROUPS.map(|g| format!("{}.{g}", env.prefix));
    let mut ensure = vec!["topics", "ensure"];
    for group in &groups {
        ensure.extend(["--group", group]);
    }
    env.cli(&ensure).success();
    let db = env.db();

    // cdc was started with the default timeout: restarted with the measured one.
    let mut cdc = cdc;
    if !timeout_args.is_empty() {
        sigterm(&mut cdc);
        cdc = source.spawn_with("table_user", &timeout_args);
    }
    let cdc_log = if timeout_args.is_empty() {
        logs[0].clone()
    } else {
        stderr_lines(&mut cdc)
    };
    let mut processes = vec![
        Supervised::start("api", || env.spawn(&["api", "--addr", "127.0.0.1:0"])),
        Supervised::start("relay", || {
            let mut args = timeout_args.clone();
            args.extend(["relay", "--instance", "relay-0", "--output", "json"]);
            env.spawn(&args)
        }),
        Supervised::adopt("cdc", cdc, cdc_log, || {
            source.spawn_with("table_user", &timeout_args)
        }),
        Supervised::start("router", || spawn_consumer(env, ROUTER_ARGS)),
    ];
    let group_labels = ["consume billing", "consume shipping"];
    for (label, group) in group_labels.into_iter().zip(&groups) {
        processes.push(Supervised::start(label, move || {
            spawn_consumer(
                env,
                &["consume", "--group", group, "--handler", ALL_HANDLERS],
            )
        }));
    }
    let mut fleet = Fleet {
        since: started,
        processes,
    };
    let announced = wait_for_line(
        &fleet.get("api").logs[0],
        &["order API listening on http://"],
        Duration::from_secs(60),
    )
    .await;
    let api = format!(
        "http://{}",
        announced.rsplit("http://").next().unwrap().trim()
    );

    // The load, until told to stop: orders through the API (their events
    // through the outbox and the relay to both groups) and transactions on
    // table_user (through cdc and the router to the endpoint), each at a
    // steady rate the debug build keeps up with on a loaded machine.
    let stop = Arc::new(AtomicBool::new(false));
    let orders = tokio::spawn({
        let (stop, api) = (stop.clone(), api.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut events = 0;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                events += drive_orders(&api, 4, 4).await;
            }
            events
        }
    });
    let writes = tokio::spawn({
        let (stop, pool) = (stop.clone(), source.pool.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            let mut n: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                n += 1;
                let sql = format!(
                    "BEGIN; INSERT INTO table_user VALUES ({n}, 'u{n}', 1); \
                     UPDATE table_user SET status = 2 WHERE id = {}; COMMIT",
                    n - 1
                );
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            n
        }
    });
    let delivered = || seen.lock().unwrap().len();
    let applied = async |db: &orderpipe::db::Db| {
        let mut counts = Vec::new();
        for group in &groups {
            counts.push(count_rows(db, group).await);
        }
        counts
    };

    // Everything flows before the broker goes away.
    fleet
        .wait_for("flowing", Duration::from_secs(90), async || {
            let applied = applied(&db).await;
            let delivered = delivered();
            if applied.iter().all(|&n| n > 0) && delivered > 0 {
                Ok(())
            } else {
                Err(format!("applied {applied:?}, delivered {delivered}"))
            }
        })
        .await;

    eprintln!("broker away: {outage:?}");
    let how = match outage {
        Outage::Crash => "kill",
        Outage::ControlledShutdown => "stop",
    };
    tokio::task::block_in_place(|| stack(&[how, "kafka"]));
    let stopped = Instant::now();
    fleet.run_for(OUTAGE).await;
    tokio::task::block_in_place(|| stack(&["start", "kafka"]));
    let down = stopped.elapsed();
    eprintln!("broker back after {:.1} s", down.as_secs_f64());

    // Recovery, with the load still on: the relay publishes every row
    // recorded before the broker was back, each group applies more, cdc and
    // the router deliver more.
    let recorded = count(&db, "SELECT COALESCE(MAX(id), 0) FROM outbox_messages").await;
    let applied_then = applied(&db).await;
    let delivered_then = delivered();
    let relay_recovery = fleet
        .wait_for("recovered", Duration::from_secs(120), async || {
            let unsent = count(
                &db,
                &format!(
                    "SELECT COUNT(*) FROM outbox_messages WHERE id <= {recorded} AND sent_ms IS NULL"
                ),
            )
            .await;
            let applied = applied(&db).await;
            let delivered = delivered();
            let groups_on = applied.iter().zip(&applied_then).all(|(now, then)| now > then);
            if unsent == 0 && groups_on && delivered > delivered_then {
                Ok(())
            } else {
                Err(format!(
                    "{unsent} rows of before unsent, applied {applied:?} (then {applied_then:?}), \
                     delivered {delivered} (then {delivered_then})"
                ))
            }
        })
        .await;
    eprintln!(
        "recovered {:.1} s after the broker was back",
        relay_recovery.as_secs_f64()
    );

    // Then the load stops and everything drains.
    stop.store(true, Ordering::Relaxed);
    let produced = orders.await.unwrap();
    let transactions = writes.await.unwrap();
    let events = outbox_events(env).await;
    assert_eq!(
        events.len(),
        produced,
        "the API recorded each event it acknowledged"
    );
    let changes = written_changes(transactions);
    fleet
        .wait_for("drained", Duration::from_secs(120), async || {
            let unsent = count(
                &db,
                "SELECT COUNT(*) FROM outbox_messages WHERE sent_ms IS NULL",
            )
            .await;
            let applied = applied(&db).await;
            let received: BTreeSet<(String, i64)> =
                seen.lock().unwrap().iter().map(|(_, _, b)| change_of(b)).collect();
            let missing = changes.difference(&received).count();
            if unsent == 0 && applied.iter().all(|&n| n == produced as i64) && missing == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{unsent} unsent, applied {applied:?} of {produced}, {missing} of {} changes not delivered",
                    changes.len()
                ))
            }
        })
        .await;

    // What a read_committed reader sees on each topic.
    let order_topic = env.settings.topics.order_events.name.clone();
    let inventory_topic = env.settings.topics.inventory_events.name.clone();
    let cdc_topic = source.topic("table_user");
    let (order_records, inventory_records, change_records) = tokio::task::block_in_place(|| {
        (
            read_settled(env, &order_topic),
            read_settled(env, &inventory_topic),
            read_settled(env, &cdc_topic),
        )
    });
    let inventory_rows = count(
        &db,
        &format!("SELECT COUNT(*) FROM outbox_messages WHERE topic = '{inventory_topic}'"),
    )
    .await;
    let published: BTreeSet<String> = event_ids(&order_records).into_iter().collect();
    let recorded_ids: BTreeSet<String> = events.iter().map(|e| e.event_id.to_string()).collect();
    let per_topic = [
        ("order events", duplicates(&order_records)),
        ("inventory events", duplicates(&inventory_records)),
        ("row changes", duplicates(&change_records)),
    ];
    let bodies: Vec<(String, i64)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, b)| change_of(b))
        .collect();
    let delivered_once: BTreeSet<&(String, i64)> = bodies.iter().collect();
    let applied_end = applied(&db).await;

    fleet.supervise();
    let relay_log = fleet.get("relay");
    let cdc_log = fleet.get("cdc");
    let measured = [
        (
            "relay: transactions aborted",
            relay_log.lines_with(&["Kafka transaction aborted"]),
        ),
        (
            "relay: producers failed fatally",
            relay_log.lines_with(&["failed fatally"]),
        ),
        (
            "relay: producers renewed after a timed-out transaction",
            relay_log.lines_with(&["timed out and was aborted"]),
        ),
        (
            "relay: of them fenced",
            relay_log.lines_with(&["failed fatally", "fenced"]),
        ),
        (
            "relay: gave up (exit)",
            relay_log.lines_with(&["relay gives up"]),
        ),
        (
            "cdc: transactions failed",
            cdc_log.lines_with(&["Kafka transaction failed"]),
        ),
    ];
    eprintln!(
        "\nbroker restart ({outage:?}, transaction.timeout.ms {}): broker down {:.1} s, relay caught up {:.1} s after it was back",
        transaction_timeout.as_deref().unwrap_or("default"),
        down.as_secs_f64(),
        relay_recovery.as_secs_f64()
    );
    eprintln!(
        "produced {produced} order events ({inventory_rows} inventory events), {} row changes in {transactions} transactions",
        changes.len()
    );
    eprintln!(
        "published {} distinct order events; applied {:?} by {groups:?}; delivered {} POSTs, {} distinct row changes",
        published.len(),
        applied_end,
        bodies.len(),
        delivered_once.len()
    );
    for (topic, (records, dups)) in &per_topic {
        eprintln!("read_committed {topic}: {records} records, {dups} duplicates");
    }
    eprintln!(
        "endpoint: {} repeated POSTs (same request id)",
        bodies.len() - delivered_once.len()
    );
    for p in &fleet.processes {
        eprintln!("restarts of {}: {} {:?}", p.label, p.exits.len(), p.exits);
    }
    for (what, n) in &measured {
        eprintln!("{what}: {n}");
    }
    // Members that found their group handler stuck and stopped (consumer/coordinator_watch.rs).
    for p in &fleet.processes {
        let stuck = p.lines_with(&["consumer group handler stuck"]);
        if stuck > 0 {
            eprintln!("{}: stopped with its group handler stuck: {stuck}", p.label);
        }
    }
    for (p, parts) in [
        (relay_log, &["failed fatally"][..]),
        (relay_log, &["Kafka transaction aborted"]),
        (cdc_log, &["Kafka transaction failed"]),
        (cdc_log, &["ERROR"]),
        (cdc_log, &["Error"]),
    ] {
        if let Some(line) = p.first_with(parts) {
            eprintln!("first {} line with {parts:?}: {line}", p.label);
        }
    }

    // Every process's whole log, for a failure's post-mortem (the CI prints only the tail).
    eprintln!("whole logs: {}", fleet.save_logs());

    // Nothing lost, nothing twice.
    assert_eq!(published, recorded_ids, "every recorded event published");
    for (topic, (records, dups)) in &per_topic {
        assert_eq!(*dups, 0, "{topic}: a change twice among {records} records");
    }
    assert_eq!(
        inventory_records.len() as i64,
        inventory_rows,
        "inventory events"
    );
    for group in &groups {
        assert_exactly_once(&db, group, &events).await;
    }
    let on_topic: BTreeSet<(String, i64)> = change_records.iter().map(record_change).collect();
    assert_eq!(on_topic, changes, "every row change on the change topic");
    assert!(
        changes.iter().all(|c| delivered_once.contains(c)),
        "every row change delivered"
    );
    // Every process runs (restarted at most MAX_RESTARTS times: supervise fails past that).
    for p in &mut fleet.processes {
        assert!(
            p.child.try_wait().unwrap().is_none(),
            "{} is not running at the end:\n{}",
            p.label,
            p.tail(30)
        );
    }
    for p in &mut fleet.processes {
        sigterm(&mut p.child);
    }
}
