//! The set statements of `orderpipe::db::rows`, on MariaDB and SQLite:
//! what each one writes, reads, changes and deletes is read back with plain
//! SQL, texts that need escaping and bytes included; a key set of any size
//! is one statement; and, on MariaDB, an insert stalled on a row lock
//! holds back no other insert into its table.

use orderpipe::db::rows::{self, Bound};
use orderpipe::db::{DatabaseSettings, Db};
use sqlx::Row;

use crate::helpers::TestEnv;

/// A row of the probe table: key, name, raw bytes.
type Probe = (i64, Option<String>, Option<Vec<u8>>);
/// The same with its note, after the updates.
type Noted = (i64, Option<String>, Option<String>, Option<Vec<u8>>);

/// Every row of the probe table, in insertion order (its auto-increment id).
async fn probe_rows(db: &Db) -> Vec<Probe> {
    sqlx::query_as("SELECT k, name, raw FROM rows_probe ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

/// The names of `keys` the way `rows::select_in` finds them, sorted.
async fn select_names(db: &Db, keys: &[i64]) -> Vec<(i64, Option<String>)> {
    let mut tx = db.begin().await.unwrap();
    let found = rows::select_in(&mut tx, "SELECT k, name FROM rows_probe", "k", "", keys)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut found: Vec<(i64, Option<String>)> =
        found.iter().map(|r| (r.get(0), r.get(1))).collect();
    found.sort();
    found
}

/// Inserts `(key, name, raw)` rows with `INSERT IGNORE ... RETURNING k`:
/// the keys the database says it wrote, in its order.
async fn insert(db: &Db, probes: &[(i64, Option<&str>, Vec<u8>)]) -> Vec<i64> {
    let mut tx = db.begin().await.unwrap();
    let verb = tx.sql().insert_ignore_verb();
    let written = rows::insert_returning(
        &mut tx,
        verb,
        "rows_probe (k, name, raw)",
        "k",
        probes,
        |(k, name, raw)| vec![Bound::Int(*k), Bound::MaybeText(*name), Bound::Bytes(raw)],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    written.iter().map(|r| r.get::<i64, _>(0)).collect()
}

async fn every_set_statement_writes_what_it_was_given(db: &Db) {
    // Texts that JSON and SQL both escape, bytes of every kind, a NULL.
    let tricky = "quote \" apostrophe ' backslash \\ newline \n tab \t 注文 🚚 \u{1}";
    let first = [
        (3, Some(tricky), vec![0u8, 255, 16, b'"']),
        (1, None, vec![]),
        (2, Some(""), b"\\x00".to_vec()),
    ];
    assert_eq!(insert(db, &first).await, [3, 1, 2]);
    // Rows go in in the given order (the auto-increment numbers them so).
    assert_eq!(
        probe_rows(db).await,
        [
            (3, Some(tricky.to_string()), Some(vec![0, 255, 16, b'"'])),
            (1, None, Some(vec![])),
            (2, Some(String::new()), Some(b"\\x00".to_vec())),
        ]
    );
    // A key present already is ignored and not returned.
    assert_eq!(
        insert(
            db,
            &[(1, Some("again"), vec![9]), (4, Some("four"), vec![4])]
        )
        .await,
        [4]
    );
    assert_eq!(probe_rows(db).await[1], (1, None, Some(vec![])));

    // A key list with repeats and misses finds each row once.
    assert_eq!(
        select_names(db, &[2, 4, 2, 99, 4]).await,
        [(2, Some(String::new())), (4, Some("four".into()))]
    );

    // Each row's own values, where the condition holds (key 1's name is NULL).
    let mut tx = db.begin().await.unwrap();
    let moves = [
        (1, vec![Bound::Text("one"), Bound::Bytes(&[1, 1])]),
        (4, vec![Bound::Text("vier"), Bound::Bytes(&[4, 4])]),
        (77, vec![Bound::Text("nobody"), Bound::Bytes(&[7])]),
    ];
    let changed = rows::update_each(
        &mut tx,
        "rows_probe",
        "note = 'moved'",
        &["name", "raw"],
        "k",
        "name IS NOT NULL",
        &moves,
    )
    .await
    .unwrap();
    assert_eq!(changed, 1);
    // One value for every key, with a condition of its own.
    let noted = rows::update_in(
        &mut tx,
        "rows_probe",
        "note",
        Bound::Text("seen"),
        "k",
        " AND note IS NULL",
        &[1, 2, 4, 4],
    )
    .await
    .unwrap();
    assert_eq!(noted, 2);
    tx.commit().await.unwrap();
    let notes: Vec<Noted> = sqlx::query_as("SELECT k, note, name, raw FROM rows_probe ORDER BY k")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        notes,
        [
            (1, Some("seen".into()), None, Some(vec![])),
            (
                2,
                Some("seen".into()),
                Some(String::new()),
                Some(b"\\x00".to_vec())
            ),
            (3, None, Some(tricky.into()), Some(vec![0, 255, 16, b'"'])),
            (
                4,
                Some("moved".into()),
                Some("vier".into()),
                Some(vec![4, 4])
            ),
        ]
    );

    // Deletes count each row once, and only the keys named.
    let mut tx = db.begin().await.unwrap();
    assert_eq!(
        rows::delete_in(&mut tx, "rows_probe", "k", &[3, 3, 100])
            .await
            .unwrap(),
        1
    );
    tx.commit().await.unwrap();
    assert_eq!(
        probe_rows(db).await.iter().map(|p| p.0).collect::<Vec<_>>(),
        [1, 2, 4]
    );

    // A text past the longest VARCHAR (16,383 characters) is stored whole,
    // not cut, by an insert and by an update (whose set reads such a column
    // as a LONGTEXT).
    let long = "注文".repeat(10_000);
    assert_eq!(insert(db, &[(5, Some(long.as_str()), vec![5])]).await, [5]);
    let longer = format!("{long}!");
    let mut tx = db.begin().await.unwrap();
    let renamed = [(5, vec![Bound::Text(&longer), Bound::Bytes(&[5])])];
    let changed = rows::update_each(
        &mut tx,
        "rows_probe",
        "note = NULL",
        &["name", "raw"],
        "k",
        "1 = 1",
        &renamed,
    )
    .await
    .unwrap();
    assert_eq!(changed, 1);
    tx.commit().await.unwrap();
    assert_eq!(
        probe_rows(db).await.last(),
        Some(&(5, Some(longer.clone()), Some(vec![5])))
    );

    // Empty sets touch nothing and send nothing.
    assert!(insert(db, &[]).await.is_empty());
    assert!(select_names(db, &[]).await.is_empty());
}

/// The server's count of a statement kind on this connection (MariaDB's
/// session status); `None` on SQLite, which keeps none.
async fn statements_run(tx: &mut orderpipe::db::Tx, kind: &str) -> Option<i64> {
    if tx.sql() != orderpipe::db::Dialect::MySql {
        return None;
    }
    let (n,): (String,) = sqlx::query_as(
        "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = ?",
    )
    .bind(kind.to_uppercase())
    .fetch_one(&mut **tx)
    .await
    .unwrap();
    Some(n.parse().unwrap())
}

/// 1,300 rows, past any one statement shape: all inserted, in order; then
/// all changed by one statement, as the server's own count of the
/// connection's multi-table `UPDATE`s says.
async fn a_large_set_goes_in_whole_and_changes_in_one_statement(db: &Db) {
    let probes: Vec<(i64, String)> = (1000..2300).map(|k| (k, format!("bulk {k}"))).collect();
    let keys: Vec<i64> = probes.iter().map(|p| p.0).collect();
    let named: Vec<(i64, Option<&str>, Vec<u8>)> = probes
        .iter()
        .map(|(k, name)| (*k, Some(name.as_str()), Vec::new()))
        .collect();
    assert_eq!(insert(db, &named).await, keys);
    let mut tx = db.begin().await.unwrap();
    let before = statements_run(&mut tx, "Com_update_multi").await;
    let changed = rows::update_in(
        &mut tx,
        "rows_probe",
        "note",
        Bound::Text("bulk"),
        "k",
        "",
        &keys,
    )
    .await
    .unwrap();
    let after = statements_run(&mut tx, "Com_update_multi").await;
    tx.commit().await.unwrap();
    assert_eq!(changed, 1300);
    if let (Some(before), Some(after)) = (before, after) {
        assert_eq!(after - before, 1, "one UPDATE for 1,300 keys");
    }
    let stored: Vec<(i64, String)> = sqlx::query_as(
        "SELECT k, name FROM rows_probe WHERE k >= 1000 AND note = 'bulk' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(stored, probes);
}

/// An insert that waits on a row lock (its key is being written by a
/// transaction left open, as when a partition stalls on the database) holds
/// back no insert of other rows into the same table. An `INSERT ... SELECT`
/// would: on MariaDB's default `innodb_autoinc_lock_mode = 1` it holds the
/// table's AUTO-INC lock until it ends, and every other insert into the
/// table, the application's own included, waits behind it.
async fn an_insert_waiting_on_a_row_lock_holds_back_no_other_insert(db: &Db) {
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO rows_probe (k, name) VALUES (7000, 'held')")
        .execute(&mut *holder)
        .await
        .unwrap();

    // Waits on key 7000 until the holder ends.
    let waiting = tokio::spawn({
        let db = db.clone();
        async move {
            insert(
                &db,
                &[(7000, Some("late"), vec![]), (7001, Some("late"), vec![])],
            )
            .await
        }
    });
    // Waiting, as the server shows it: the statement has run for half a
    // second (it takes milliseconds when nothing holds it). InnoDB's own
    // list of lock waits is a cache that does not always show it.
    let started = std::time::Instant::now();
    loop {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() \
             AND INFO LIKE 'INSERT IGNORE INTO rows_probe%' AND TIME_MS >= 500",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if n > 0 {
            break;
        }
        assert!(
            !waiting.is_finished() && started.elapsed() < std::time::Duration::from_secs(30),
            "the insert of a held key did not wait"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // Another key, while the first insert waits: it must not wait. A lock
    // wait past 5 s fails the statement (error 1205) and so the test.
    let mut tx = db.begin().await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 5")
        .execute(&mut *tx)
        .await
        .unwrap();
    let verb = tx.sql().insert_ignore_verb();
    let other = rows::insert_returning(&mut tx, verb, "rows_probe (k, name)", "k", &[8000], |k| {
        vec![Bound::Int(*k), Bound::Text("free")]
    })
    .await
    .expect("an insert of another key waited for the stalled one");
    tx.commit().await.unwrap();
    assert_eq!(other.len(), 1);

    // The holder gives up its row; the waiting insert then writes both.
    holder.rollback().await.unwrap();
    assert_eq!(waiting.await.unwrap(), [7000, 7001]);
}

#[tokio::test(flavor = "multi_thread")]
async fn set_statements_on_mariadb_write_read_and_count_like_plain_sql() {
    let env = TestEnv::new().with_database().await;
    let db = env.db();
    sqlx::query(
        "CREATE TABLE rows_probe (id BIGINT AUTO_INCREMENT PRIMARY KEY, k BIGINT NOT NULL UNIQUE, \
         name MEDIUMTEXT NULL, raw VARBINARY(16) NULL, note VARCHAR(20) NULL) \
         DEFAULT CHARSET utf8mb4",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    every_set_statement_writes_what_it_was_given(&db).await;
    a_large_set_goes_in_whole_and_changes_in_one_statement(&db).await;
    // Four connections: the lock holder, the waiting insert, the other
    // insert and the watch on the server's lock waits.
    let db = Db::connect(&env.settings.database, 4).unwrap();
    an_insert_waiting_on_a_row_lock_holds_back_no_other_insert(&db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn set_statements_on_sqlite_write_read_and_count_like_plain_sql() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(
        &DatabaseSettings {
            url: format!("sqlite://{}/t.db?mode=rwc", dir.path().display()).into(),
            max_connections: Some(1),
        },
        1,
    )
    .unwrap();
    sqlx::query(
        "CREATE TABLE rows_probe (id INTEGER PRIMARY KEY AUTOINCREMENT, k INTEGER NOT NULL UNIQUE, \
         name TEXT NULL, raw BLOB NULL, note TEXT NULL)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    every_set_statement_writes_what_it_was_given(&db).await;
    a_large_set_goes_in_whole_and_changes_in_one_statement(&db).await;
}
