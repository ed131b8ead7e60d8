//! `orderpipe cdc` across a failover: a checkpoint written on one MariaDB
//! resumes by GTID on its promoted replica, whose binlog files and
//! positions differ, with no change lost or published twice.
//!
//! Both servers are scratch `mariadbd` processes of this test (under
//! `target/cdc-failover/`), with the dev stack's binlog options: a replica
//! of the dev stack's MariaDB would replay the other tests' writes to
//! tables it does not have and stop, and a replication filter would leave
//! their GTIDs out of its binlog, which is not what a failover looks like.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orderpipe::cdc::change::{ChangeEvent, ChangeKind, topic_schema};
use orderpipe::codec::Codec;
use rdkafka::Message;

use crate::helpers::wait_for_topic;
use crate::helpers::{TestEnv, cdc_server_id};

/// A MariaDB of this test: its own datadir, port and socket; stopped and
/// deleted when dropped (also when the test fails).
struct ScratchMariadb {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl ScratchMariadb {
    /// Initialises and starts a server with `server_id`, the binlog named
    /// `<name>-bin`, and the user orderpipe/orderpipe (not binlogged).
    fn start(prefix: &str, name: &str, server_id: u32) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/cdc-failover")
            .join(format!("{prefix}-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.display();
        std::fs::write(
            dir.join("my.cnf"),
            format!(
                "[mariadbd]\nuser=root\ndatadir={d}/data\nsocket={d}/s.sock\npid-file={d}/m.pid\n\
                 log-error={d}/m.log\nbind-address=127.0.0.1\nport={port}\nskip-name-resolve\n\
                 innodb_buffer_pool_size=32M\ninnodb_log_file_size=16M\n\
                 log_bin={name}-bin\nlog_slave_updates=1\nbinlog_format=ROW\nbinlog_row_image=FULL\n\
                 binlog_row_metadata=FULL\nserver_id={server_id}\ngtid_strict_mode=1\nskip_slave_start=1\n"
            ),
        )
        .unwrap();
        let install = Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=root",
                "--basedir=/usr",
                &format!("--datadir={d}/data"),
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ])
            .output()
            .expect("mariadb-install-db runs (dev/stack.sh installs mariadb-server)");
        assert!(install.status.success(), "{install:?}");
        let mariadbd = ["/usr/sbin/mariadbd", "/usr/bin/mariadbd"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("mariadbd");
        let child = Command::new(mariadbd)
            .arg(format!("--defaults-file={d}/my.cnf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd starts");
        let server = Self {
            dir,
            port,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !server
            .try_root("SELECT 1")
            .is_ok_and(|o| o.status.success())
        {
            assert!(
                Instant::now() < deadline,
                "{name} did not answer within 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server.root(
            "SET sql_log_bin = 0; \
             CREATE USER 'orderpipe'@'%' IDENTIFIED BY 'orderpipe'; \
             CREATE USER 'orderpipe'@'127.0.0.1' IDENTIFIED BY 'orderpipe'; \
             GRANT ALL ON *.* TO 'orderpipe'@'%'; GRANT ALL ON *.* TO 'orderpipe'@'127.0.0.1'",
        );
        server
    }

    fn try_root(&self, sql: &str) -> std::io::Result<std::process::Output> {
        Command::new("mariadb")
            .args(["--no-defaults", "-uroot", "-N", "-B"])
            .arg(format!("--socket={}/s.sock", self.dir.display()))
            .args(["-e", sql])
            .output()
    }

    /// Runs `sql` as root; its output, trimmed.
    fn root(&self, sql: &str) -> String {
        let out = self.try_root(sql).unwrap();
        assert!(out.status.success(), "{sql}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn url(&self) -> String {
        format!("mysql://orderpipe:orderpipe@127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGKILL: the primary dies).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ScratchMariadb {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `orderpipe cdc` of `env` on `source`, capturing shop.t.
fn spawn_cdc(env: &TestEnv, source: &str, server_id: &str, extra: &[&str]) -> Child {
    let mut args = vec!["cdc", "--table", "shop.t", "--server-id", server_id];
    args.extend_from_slice(extra);
    env.command(&args)
        .env("ORDERPIPE_CDC__SOURCE", source)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("orderpipe starts")
}

/// Kills `child` and returns what it wrote to stderr.
fn kill_and_stderr(mut child: Child) -> String {
    let _ = child.kill();
    let _ = child.wait();
    let mut text = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text
}

/// Reads exactly `count` changes of `topic` (read_committed), decoded.
async fn changes(env: &TestEnv, topic: &str, count: usize) -> Vec<(i32, i64, ChangeEvent)> {
    let codec = Codec::new(&env.settings.registry, topic, &topic_schema(topic), false).unwrap();
    let messages = tokio::task::block_in_place(|| {
        wait_for_topic(env, topic);
        env.read(topic, count, Duration::from_secs(60))
    });
    let mut out = Vec::new();
    for m in messages {
        let event = ChangeEvent::from_avro(codec.decode_value(m.payload()).await.unwrap()).unwrap();
        out.push((m.partition(), m.offset(), event));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_failover_cdc_resumes_by_gtid_on_the_promoted_replica_without_loss_or_duplicate() {
    let env = TestEnv::new().with_cdc();
    let prefix = env.prefix.clone();
    let topic = format!("{prefix}.cdc.shop.t");
    let cdc_server_id = cdc_server_id();

    let mut primary = ScratchMariadb::start(&prefix, "primary", 1);
    let replica = ScratchMariadb::start(&prefix, "replica", 2);
    primary
        .root("CREATE DATABASE shop; CREATE TABLE shop.t (id BIGINT PRIMARY KEY, v INT NOT NULL)");
    replica.root(&format!(
        "CHANGE MASTER TO master_host = '127.0.0.1', master_port = {}, master_user = 'orderpipe', \
         master_password = 'orderpipe', master_use_gtid = slave_pos; START SLAVE",
        primary.port
    ));
    let status = primary.root("SHOW MASTER STATUS");
    let mut status = status.split('\t');
    let start = format!("{}:{}", status.next().unwrap(), status.next().unwrap());

    // A: captured on the primary.
    let cdc = spawn_cdc(
        &env,
        &primary.url(),
        &cdc_server_id,
        &["--start-position", &start],
    );
    for id in 1..=20 {
        primary.root(&format!("INSERT INTO shop.t VALUES ({id}, 0)"));
    }
    changes(&env, &topic, 20).await;
    let on_primary = kill_and_stderr(cdc);

    // B: written on the primary while cdc is down, until the replica has it.
    primary.root(
        "USE shop; INSERT INTO t SELECT seq, 0 FROM seq_21_to_40; \
         BEGIN; UPDATE shop.t SET v = 1 WHERE id <= 10; COMMIT; \
         BEGIN; UPDATE shop.t SET v = 1 WHERE id > 10 AND id <= 20; COMMIT",
    );
    let written = primary.root("SELECT @@gtid_binlog_pos");
    let deadline = Instant::now() + Duration::from_secs(30);
    while replica.root("SELECT @@gtid_slave_pos") != written {
        assert!(
            Instant::now() < deadline,
            "the replica did not reach {written}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The failover: the primary dies, the replica is promoted.
    primary.kill();
    replica.root("STOP SLAVE; RESET SLAVE ALL");

    // The checkpoint's file and position mean nothing on the replica.
    let by_position = env
        .command(&[
            "cdc",
            "--table",
            "shop.t",
            "--server-id",
            &cdc_server_id,
            "--resume",
            "position",
        ])
        .env("ORDERPIPE_CDC__SOURCE", replica.url())
        .output()
        .unwrap();
    let refused = String::from_utf8_lossy(&by_position.stderr).to_string();
    assert!(
        !by_position.status.success() && refused.contains("no binlog at primary-bin."),
        "{refused}"
    );
    let bad = env.command(&["cdc", "--resume", "file"]).output().unwrap();
    let bad = String::from_utf8_lossy(&bad.stderr).to_string();
    assert!(
        bad.contains("--resume") && bad.contains("auto, position, gtid"),
        "{bad}"
    );

    // C: cdc on the promoted replica (resume auto: another server), more writes there.
    let cdc = spawn_cdc(&env, &replica.url(), &cdc_server_id, &[]);
    replica.root(
        "USE shop; INSERT INTO t SELECT seq, 0 FROM seq_41_to_60; \
         UPDATE shop.t SET v = 2 WHERE id BETWEEN 21 AND 40; \
         DELETE FROM shop.t WHERE id <= 5",
    );
    let all = changes(&env, &topic, 20 + 40 + 45).await;
    let on_replica = kill_and_stderr(cdc);
    assert!(
        on_replica.contains("resuming by GTID 0-1-") && on_replica.contains("on server 2"),
        "{on_replica}"
    );

    // Each change once, in commit order per key.
    let ids: HashSet<_> = all.iter().map(|(_, _, e)| e.event_id).collect();
    assert_eq!(ids.len(), all.len(), "a change published twice");
    let mut sorted: Vec<&(i32, i64, ChangeEvent)> = all.iter().collect();
    sorted.sort_by_key(|(p, o, _)| (*p, *o));
    let mut per_key: BTreeMap<i64, Vec<(ChangeKind, i64)>> = BTreeMap::new();
    for (_, _, e) in &sorted {
        per_key
            .entry(e.key.parse().unwrap())
            .or_default()
            .push((e.change, e.data["v"].as_i64().unwrap()));
    }
    use ChangeKind::{Delete, Insert, Update};
    for id in 1..=60i64 {
        let expected = match id {
            1..=5 => vec![(Insert, 0), (Update, 1), (Delete, 1)],
            6..=20 => vec![(Insert, 0), (Update, 1)],
            21..=40 => vec![(Insert, 0), (Update, 2)],
            _ => vec![(Insert, 0)],
        };
        assert_eq!(per_key.get(&id), Some(&expected), "key {id}");
    }
    // A was read from the primary's binlog, B and C from the replica's;
    // C's GTIDs are the promoted server's.
    let file_of = |id: i64, kind: ChangeKind| {
        let (_, _, e) = sorted
            .iter()
            .find(|(_, _, e)| e.key == id.to_string() && e.change == kind)
            .unwrap();
        (e.binlog_file.clone(), e.gtid.clone().unwrap())
    };
    assert!(file_of(1, Insert).0.starts_with("primary-bin."));
    let (file, gtid) = file_of(30, Insert);
    assert!(
        file.starts_with("replica-bin.") && gtid.starts_with("0-1-"),
        "{file} {gtid}"
    );
    let (file, gtid) = file_of(50, Insert);
    assert!(
        file.starts_with("replica-bin.") && gtid.starts_with("0-2-"),
        "{file} {gtid}"
    );
    // The last checkpoint is the replica's position, with its server and GTID state.
    let checkpoint = orderpipe::cdc::checkpoint::last_committed(
        &env.settings.kafka,
        &format!("{prefix}.cdc.offsets"),
        &prefix,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(checkpoint.position.server_id, Some(2), "{checkpoint:?}");
    assert!(
        checkpoint.position.file.starts_with("replica-bin."),
        "{checkpoint:?}"
    );
    assert_eq!(
        checkpoint.position.gtid_state.as_deref(),
        Some(replica.root("SELECT @@gtid_binlog_pos").as_str()),
        "{on_primary}"
    );
}

/// Spawns `cdc` on `source`'s table with `--resume gtid`, waits until it is
/// ready (its first checkpoint is then committed); returns it and its stderr
/// as it comes.
fn spawn_ready_by_gtid(
    source: &crate::cdc::Source,
    server_id: &str,
) -> (
    crate::helpers::Spawned,
    std::sync::Arc<std::sync::Mutex<String>>,
) {
    use std::io::BufRead;
    let table = format!("{}.t", source.database);
    let mut cdc = source.env.spawn(&[
        "cdc",
        "--table",
        &table,
        "--server-id",
        server_id,
        "--resume",
        "gtid",
        "--health-addr",
        "127.0.0.1:0",
    ]);
    let stderr = cdc.stderr.take().unwrap();
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = text.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.strip_prefix("health endpoints on http://") {
                let _ = tx.send(rest.trim_end_matches("/health/ready").to_string());
            }
            let mut all = lines.lock().unwrap();
            all.push_str(&line);
            all.push('\n');
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::helpers::http_get(&addr, "/health/ready").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "cdc not ready: {}",
            text.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (cdc, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn with_resume_gtid_a_restart_on_the_same_busy_server_resumes_by_gtid_exactly_once() {
    // The dev stack's MariaDB, with the other tests writing to it meanwhile.
    let source =
        crate::cdc::Source::new(&["CREATE TABLE t (id BIGINT PRIMARY KEY, v INT NOT NULL)"]).await;
    let topic = source.topic("t");
    let server_id = cdc_server_id();
    let (cdc, _) = tokio::task::block_in_place(|| spawn_ready_by_gtid(&source, &server_id));
    for id in 1..=10 {
        source
            .exec(&[&format!("INSERT INTO t VALUES ({id}, 0)")])
            .await;
    }
    changes(&source.env, &topic, 10).await;
    drop(cdc); // SIGKILL
    for id in 1..=10 {
        source
            .exec(&[&format!("UPDATE t SET v = 1 WHERE id = {id}")])
            .await;
    }
    let (cdc, stderr) = tokio::task::block_in_place(|| spawn_ready_by_gtid(&source, &server_id));
    for id in 1..=10 {
        source
            .exec(&[
                &format!("UPDATE t SET v = 2 WHERE id = {id}"),
                &format!("INSERT INTO t VALUES ({}, 0)", id + 10),
            ])
            .await;
    }
    let all = changes(&source.env, &topic, 40).await;
    drop(cdc);
    assert!(
        stderr.lock().unwrap().contains("resuming by GTID"),
        "{}",
        stderr.lock().unwrap()
    );
    let ids: HashSet<_> = all.iter().map(|(_, _, e)| e.event_id).collect();
    assert_eq!(ids.len(), 40, "a change published twice");
    let mut sorted: Vec<&(i32, i64, ChangeEvent)> = all.iter().collect();
    sorted.sort_by_key(|(p, o, _)| (*p, *o));
    let mut per_key: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (_, _, e) in &sorted {
        per_key
            .entry(e.key.parse().unwrap())
            .or_default()
            .push(e.data["v"].as_i64().unwrap());
    }
    for id in 1..=20i64 {
        let expected = if id <= 10 { vec![0, 1, 2] } else { vec![0] };
        assert_eq!(per_key.get(&id), Some(&expected), "key {id}");
    }
}
