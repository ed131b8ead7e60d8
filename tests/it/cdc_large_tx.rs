//! `orderpipe cdc` and a binlog transaction much larger than
//! `cdc.batch_max_rows`: published in pieces, each its own Kafka
//! transaction with a checkpoint inside the database's transaction, and
//! still exactly once through SIGKILLs, with the event ids of the whole
//! transaction.
//!
//! The oracles: MariaDB (the table's rows and versions after the writes),
//! and the same binlog read by a second `cdc` with a `batch_max_rows` above
//! the transaction's size, which publishes it whole (the old behaviour).

use std::collections::{BTreeMap, HashSet};
use std::io::BufRead;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use orderpipe::cdc::change::{ChangeEvent, ChangeKind};
use rdkafka::message::OwnedMessage;
use serde_json::json;

use crate::cdc::{Source, by_key};
use crate::helpers::Spawned;

/// Rows of the large transaction, and the pieces' size.
const ROWS: u64 = 20_000;
const PIECE: u64 = 250;
/// Rows the large transaction updates after inserting them all.
const UPDATED: u64 = 100;

/// Spawns `cdc` on the table `big` with `extra` flags; its stderr lines
/// come through the receiver (drained in a thread, so it never blocks).
fn spawn(source: &Source, extra: &[&str]) -> (Spawned, Receiver<String>) {
    let mut cdc = source.spawn_with("big", extra);
    let stderr = cdc.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (cdc, rx)
}

/// The first stderr line containing `needle` (30 s at most).
fn line_with(lines: &Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    panic!("no line with {needle:?} within 30 s; saw {seen:#?}")
}

/// Waits until the source's committed checkpoint is inside a transaction
/// with at least `at_least` of its changes published; returns that count.
async fn published_inside(source: &Source, cdc: &mut Spawned, at_least: u64) -> u64 {
    let offsets = format!("{}.cdc.offsets", source.env.prefix);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    loop {
        // An error: the offsets topic is not created yet.
        if let Ok(checkpoint) = orderpipe::cdc::checkpoint::last_committed(
            &source.env.settings.kafka,
            &offsets,
            &source.env.prefix,
        )
        .await
        {
            last = checkpoint.map(|c| c.position);
            if let Some(inside) = last.as_ref().and_then(|p| p.inside.as_ref())
                && inside.published >= at_least
            {
                return inside.published;
            }
        }
        assert!(
            matches!(cdc.try_wait(), Ok(None)),
            "cdc exited: {}",
            cdc.stop_and_output()
        );
        assert!(
            Instant::now() < deadline,
            "no checkpoint inside the transaction with {at_least} changes published within 60 s; last {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `after N changes` of a line naming a checkpoint inside a transaction.
fn published_in(line: &str) -> u64 {
    let (_, rest) = line
        .split_once(" inside 0-1-")
        .unwrap_or_else(|| panic!("not inside a transaction: {line}"));
    let (_, rest) = rest.split_once(" after ").expect("after N changes");
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// What must be equal between the split and the whole publication of a change.
fn identity(event: &ChangeEvent) -> (String, ChangeKind, u32, String, String) {
    (
        event.key.clone(),
        event.change,
        event.row_index,
        event.data.to_string(),
        format!("{:?}", event.old),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_of_20k_rows_in_pieces_of_250_through_two_sigkills_is_published_once_with_the_whole_transactions_ids()
 {
    let mut source = Source::new(&[
        "CREATE TABLE big (id BIGINT PRIMARY KEY, version INT NOT NULL, note VARCHAR(40) NOT NULL)",
    ])
    .await;
    source
        .env
        .set_env("ORDERPIPE_CDC__BATCH_MAX_ROWS", &PIECE.to_string());
    let (mut cdc, _) = spawn(&source, &[]);
    // A small transaction, the large one (inserts, then updates of some of
    // its own rows: a key's changes in two pieces), a small one after.
    source
        .exec(&["INSERT INTO big VALUES (100001, 0, 'before')"])
        .await;
    source
        .exec(&[
            &format!("INSERT INTO big SELECT seq, 0, CONCAT('row ', seq) FROM seq_1_to_{ROWS}"),
            &format!("UPDATE big SET version = 1 WHERE id <= {UPDATED}"),
        ])
        .await;
    source
        .exec(&[
            "UPDATE big SET version = 2 WHERE id = 1",
            "INSERT INTO big VALUES (100002, 0, 'after')",
        ])
        .await;
    let started = Instant::now();
    // SIGKILL once a few pieces are out; the restart resumes inside the transaction.
    published_inside(&source, &mut cdc, 2 * PIECE).await;
    cdc.kill().unwrap();
    cdc.wait().unwrap();
    let (mut cdc, lines) = spawn(&source, &[]);
    // It resumes inside the transaction, after what the killed one committed
    // (which may be more than was seen before the kill).
    let first = published_in(&line_with(&lines, "reading"));
    assert!((2 * PIECE..ROWS).contains(&first), "{first}");
    // Again, further in; this time resumed by GTID (the failover path).
    published_inside(&source, &mut cdc, first + 2 * PIECE).await;
    cdc.kill().unwrap();
    cdc.wait().unwrap();
    let (mut cdc, lines) = spawn(&source, &["--resume", "gtid"]);
    let second = published_in(&line_with(&lines, "resuming by GTID"));
    assert!(second > first && second < ROWS, "{second}");
    let expected = (ROWS + UPDATED + 3) as usize;
    let split = source
        .changes("big", expected, Duration::from_secs(120))
        .await;
    eprintln!(
        "{expected} changes through 2 SIGKILLs (at {first} and {second} of the large transaction's) in {:?}",
        started.elapsed()
    );
    assert!(matches!(cdc.try_wait(), Ok(None)), "cdc still runs");
    cdc.kill().unwrap();

    // Exactly once, in commit order per key, ending in MariaDB's state.
    let ids: HashSet<_> = split.iter().map(|(_, e)| e.event_id).collect();
    assert_eq!(ids.len(), expected, "no change twice");
    let keys = by_key(&split);
    let table: BTreeMap<String, i64> =
        sqlx::query_as::<_, (i64, i64)>("SELECT id, version FROM big")
            .fetch_all(&source.pool)
            .await
            .unwrap()
            .into_iter()
            .map(|(id, version)| (id.to_string(), version))
            .collect();
    assert_eq!(keys.len(), table.len(), "a history for every row");
    for (key, events) in &keys {
        assert_eq!(events[0].change, ChangeKind::Insert, "key {key}");
        let versions: Vec<i64> = events
            .iter()
            .map(|e| e.data["version"].as_i64().unwrap())
            .collect();
        let in_order: Vec<i64> = (0..versions.len() as i64).collect();
        assert_eq!(versions, in_order, "key {key}: versions in commit order");
        assert_eq!(
            versions.last(),
            table.get(key),
            "key {key}: the topic ends in the table's state"
        );
    }
    assert_eq!(keys["1"][1].old, Some(json!({"version": 0})));
    // The large transaction: one GTID, row indexes 0.. in binlog order, read
    // in several pieces (the pieces before the last carry where they were
    // read up to, the last one the transaction's end).
    let large: Vec<&ChangeEvent> = {
        let gtid = keys["1"][0].gtid.clone();
        let mut large: Vec<&ChangeEvent> = split
            .iter()
            .map(|(_, e)| e)
            .filter(|e| e.gtid == gtid)
            .collect();
        large.sort_by_key(|e| e.row_index);
        large
    };
    assert_eq!(large.len() as u64, ROWS + UPDATED);
    assert!(
        large
            .iter()
            .enumerate()
            .all(|(i, e)| e.row_index as usize == i)
    );
    assert_eq!(large[0].key, "1");
    assert_eq!(large[ROWS as usize].change, ChangeKind::Update);
    let pieces: HashSet<u64> = large.iter().map(|e| e.binlog_pos).collect();
    assert!(
        pieces.len() as u64 >= (ROWS + UPDATED) / PIECE / 2,
        "published in pieces: {} distinct positions",
        pieces.len()
    );

    // The same binlog read whole (the old way): the same changes, the same ids.
    let whole_prefix = format!("{}.whole", source.env.prefix);
    source
        .env
        .set_env("ORDERPIPE_CDC__BATCH_MAX_ROWS", "1000000");
    source
        .env
        .set_env("ORDERPIPE_CDC__TOPIC_PREFIX", &whole_prefix);
    source.env.set_env(
        "ORDERPIPE_CDC__OFFSETS_TOPIC",
        &format!("{whole_prefix}.offsets"),
    );
    source.env.set_env(
        "ORDERPIPE_PRODUCER__TRANSACTIONAL_ID_PREFIX",
        &format!("{whole_prefix}-relay"),
    );
    let (mut whole_cdc, _) = spawn(&source, &[]);
    let topic = format!("{whole_prefix}.{}.big", source.database);
    let whole = source
        .changes_on(&topic, expected, Duration::from_secs(120))
        .await;
    whole_cdc.kill().unwrap();
    let of = |changes: &[(OwnedMessage, ChangeEvent)]| -> BTreeMap<uuid::Uuid, _> {
        changes
            .iter()
            .map(|(_, e)| (e.event_id, identity(e)))
            .collect()
    };
    let (split_ids, whole_ids) = (of(&split), of(&whole));
    assert_eq!(split_ids.len(), whole_ids.len());
    let differ: Vec<_> = split_ids
        .iter()
        .filter(|(id, e)| whole_ids.get(id) != Some(e))
        .take(3)
        .collect();
    assert!(
        differ.is_empty(),
        "every change has the id (and content) of the whole transaction's: {differ:?}"
    );
    let whole_positions: HashSet<u64> = whole
        .iter()
        .filter(|(_, e)| e.gtid == large[0].gtid)
        .map(|(_, e)| e.binlog_pos)
        .collect();
    assert_eq!(whole_positions.len(), 1, "read whole, one end position");
}
