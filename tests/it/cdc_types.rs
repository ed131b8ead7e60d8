//! The cdc type conformance suite (issue 24): every MariaDB column type,
//! through `orderpipe cdc` in both value formats and `cdc snapshot`, against
//! what MariaDB itself says about each row.
//!
//! The fixture `tests/fixtures/cdc_types.sql` (one table per type family,
//! each through inserts, an update of every column, a key change and a
//! delete) runs statement by statement on one session; after each
//! statement the test reads the table back from MariaDB with one SQL
//! expression per column that renders the value in the documented form
//! (`docs/cdc.md`, "Column values"): `col+0` for integers, BIT and YEAR,
//! `CAST(col AS CHAR)` for DECIMAL, temporal types, ENUM, SET, UUID and
//! INET, the text converted to utf8mb4, `HEX(col)` for bytes, the exact
//! value of a FLOAT (`CAST(col AS DOUBLE)`) as the shortest f32 text. Every
//! published change is then checked against those states: an insert's
//! `data` is the row after its statement, an update's `data` the row after
//! and `data` overlaid with `old` the row before (and `old` exactly the
//! changed columns), a delete's `data` the row before; every row a
//! statement changed has its change. One cdc process per value format
//! covers all tables; the snapshot runs per table in both formats.

use std::collections::BTreeMap;
use std::time::Duration;

use orderpipe::cdc::change::{ChangeEvent, ChangeKind, topic_schema};
use orderpipe::codec::Codec;
use rdkafka::Message;
use serde_json::Value as Json;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, Row};

use crate::cdc::Source;
use crate::helpers::wait_for_topic;
use crate::helpers::{MYSQL_ADMIN_URL, Spawned, TestEnv, cdc_server_id};

const FIXTURE: &str = include_str!("../fixtures/cdc_types.sql");

/// The fixture's statements: lines up to one ending with `;`, comments left out.
fn statements() -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in FIXTURE.lines() {
        if line.trim_start().starts_with("--") || line.trim().is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if line.trim_end().ends_with(';') {
            out.push(
                std::mem::take(&mut current)
                    .trim()
                    .trim_end_matches(';')
                    .to_string(),
            );
        }
    }
    assert!(
        current.trim().is_empty(),
        "the fixture ends with a statement"
    );
    out
}

/// The table a DML or CREATE statement is about, and whether it changes rows.
fn table_of(statement: &str) -> Option<(String, bool)> {
    let words: Vec<&str> = statement.split_whitespace().take(3).collect();
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    match upper.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["CREATE", "TABLE", ..] => Some((words[2].trim_matches('(').to_string(), false)),
        ["INSERT", "INTO", ..] | ["DELETE", "FROM", ..] => Some((words[2].to_string(), true)),
        ["UPDATE", ..] => Some((words[1].to_string(), true)),
        _ => None,
    }
}

/// How MariaDB's rendering of a column becomes the documented JSON form.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// A JSON number from MariaDB's decimal text (`col+0`).
    Number,
    /// The shortest text of the f32 whose exact value MariaDB gives.
    Float,
    /// The shortest text of the f64 MariaDB gives.
    Double,
    /// MariaDB's text as a JSON string.
    Text,
    /// `YYYY-MM-DD HH:MM:SS[.f]` with a `T`.
    DateTime,
    /// `YYYY-MM-DD HH:MM:SS[.f]` in UTC with a `T` and a `Z`.
    Timestamp,
    /// `0x` and the lower-case hex of the stored bytes.
    Hex,
}

/// The SQL expression and form of a column of `data_type` (information_schema).
fn oracle_of(name: &str, data_type: &str, charset: Option<&str>) -> (String, Form) {
    let c = format!("`{name}`");
    match data_type {
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint" | "bit" | "year" => {
            (format!("CAST({c}+0 AS CHAR)"), Form::Number)
        }
        "float" => (format!("CAST(CAST({c} AS DOUBLE) AS CHAR)"), Form::Float),
        "double" => (format!("CAST({c} AS CHAR)"), Form::Double),
        "datetime" => (format!("CAST({c} AS CHAR)"), Form::DateTime),
        "timestamp" => (format!("CAST({c} AS CHAR)"), Form::Timestamp),
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext"
            if charset != Some("binary") =>
        {
            (format!("CONVERT({c} USING utf8mb4)"), Form::Text)
        }
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "binary"
        | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" | "geometry" | "point"
        | "linestring" | "polygon" | "multipoint" | "multilinestring" | "multipolygon"
        | "geometrycollection" => (format!("LOWER(HEX({c}))"), Form::Hex),
        // decimal, date, time, enum, set, uuid, inet4, inet6
        _ => (format!("CAST({c} AS CHAR)"), Form::Text),
    }
}

fn render(text: Option<String>, form: Form) -> Json {
    let Some(text) = text else { return Json::Null };
    let number = |f: f64| {
        serde_json::Number::from_f64(f)
            .map(Json::Number)
            .expect("finite")
    };
    match form {
        Form::Number => serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}")),
        // The shortest text as it travels (JSON text), read back as the
        // published JSON is read (serde_json's parser may be one ULP off).
        Form::Float => {
            let exact: f64 = text.parse().unwrap();
            let shortest: f64 = (exact as f32).to_string().parse().unwrap();
            serde_json::from_str(&number(shortest).to_string()).unwrap()
        }
        Form::Double => serde_json::from_str(&number(text.parse().unwrap()).to_string()).unwrap(),
        Form::Text => Json::String(text),
        Form::DateTime => Json::String(text.replacen(' ', "T", 1)),
        Form::Timestamp => Json::String(format!("{}Z", text.replacen(' ', "T", 1))),
        Form::Hex => Json::String(format!("0x{text}")),
    }
}

/// A table's rows by primary key (`id`), each column in the documented form.
type State = BTreeMap<String, serde_json::Map<String, Json>>;

/// Reads what MariaDB says about every row of `table`.
async fn read_state(conn: &mut MySqlConnection, database: &str, table: &str) -> State {
    let columns = sqlx::query(
        "SELECT COLUMN_NAME, DATA_TYPE, CHARACTER_SET_NAME FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
    )
    .bind(database)
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let columns: Vec<(String, String, Option<String>)> = columns
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let oracles: Vec<(String, Form)> = columns
        .iter()
        .map(|(n, t, cs)| oracle_of(n, t, cs.as_deref()))
        .collect();
    let sql = format!(
        "SELECT CAST(id AS CHAR), {} FROM `{table}`",
        oracles
            .iter()
            .map(|(e, _)| e.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let mut state = State::new();
    for row in rows {
        let mut object = serde_json::Map::new();
        for (i, ((name, _, _), (_, form))) in columns.iter().zip(&oracles).enumerate() {
            object.insert(
                name.clone(),
                render(row.get::<Option<String>, _>(i + 1), *form),
            );
        }
        state.insert(row.get(0), object);
    }
    state
}

/// What a table went through: its states after each statement that changed it.
#[derive(Default)]
struct History {
    /// (statement, state before, state after) per statement that changed rows.
    steps: Vec<(String, State, State)>,
}

/// Runs the fixture in `database` on one session (its `SET`s hold for what
/// follows), reading each table's state after every statement on it.
async fn run_fixture(database: &str) -> BTreeMap<String, History> {
    let mut session = MySqlConnection::connect(&format!("{MYSQL_ADMIN_URL}{database}"))
        .await
        .unwrap();
    let mut oracle = MySqlConnection::connect(&format!("{MYSQL_ADMIN_URL}{database}"))
        .await
        .unwrap();
    // The oracle reads TIMESTAMPs in UTC.
    sqlx::raw_sql("SET time_zone = '+00:00'")
        .execute(&mut oracle)
        .await
        .unwrap();
    let mut histories: BTreeMap<String, History> = BTreeMap::new();
    let mut states: BTreeMap<String, State> = BTreeMap::new();
    for statement in statements() {
        sqlx::raw_sql(AssertSqlSafe(statement.clone()))
            .execute(&mut session)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
        let Some((table, changes)) = table_of(&statement) else {
            continue;
        };
        let after = read_state(&mut oracle, database, &table).await;
        let before = states
            .insert(table.clone(), after.clone())
            .unwrap_or_default();
        let history = histories.entry(table).or_default();
        if changes && before != after {
            history.steps.push((statement, before, after));
        }
    }
    histories
}

/// Reads `count` changes of `topic` and decodes them, in binlog order; when
/// they do not come, the error is the output of `writer` (the cdc writing them).
async fn read_changes(
    env: &TestEnv,
    topic: &str,
    count: usize,
    writer: Option<&mut Spawned>,
) -> Result<Vec<ChangeEvent>, String> {
    let codec = Codec::new(&env.settings.registry, topic, &topic_schema(topic), false).unwrap();
    let read = tokio::task::block_in_place(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for_topic(env, topic);
            env.read(topic, count, Duration::from_secs(120))
        }))
    });
    let messages = match (read, writer) {
        (Ok(messages), _) => messages,
        (Err(_), Some(writer)) => {
            return Err(format!(
                "{count} changes of {topic} did not come; cdc says:\n{}",
                writer.stop_and_output()
            ));
        }
        (Err(e), None) => std::panic::resume_unwind(e),
    };
    let mut out = Vec::new();
    for message in messages {
        let value = codec.decode_value(message.payload()).await.unwrap();
        let event = ChangeEvent::from_avro(value).unwrap_or_else(|e| panic!("{topic}: {e}"));
        assert_eq!(
            message.key(),
            Some(event.key.as_bytes()),
            "the Kafka key is the primary key"
        );
        out.push(event);
    }
    out.sort_by(|a, b| {
        (&a.binlog_file, a.binlog_pos, a.row_index).cmp(&(
            &b.binlog_file,
            b.binlog_pos,
            b.row_index,
        ))
    });
    Ok(out)
}

/// The number of changes a statement makes: rows that differ between the
/// states, a key change counted once.
fn changes_in(before: &State, after: &State) -> usize {
    let gone = before.keys().filter(|k| !after.contains_key(*k)).count();
    let new = after.keys().filter(|k| !before.contains_key(*k)).count();
    let changed = after
        .iter()
        .filter(|(k, v)| before.get(*k).is_some_and(|b| b != *v))
        .count();
    changed + gone.max(new)
}

/// Compares a published row with MariaDB's, column by column; a difference
/// is recorded as `table.column` with both values.
fn compare(
    failures: &mut BTreeMap<String, String>,
    what: &str,
    table: &str,
    published: &serde_json::Map<String, Json>,
    oracle: &serde_json::Map<String, Json>,
) {
    for (column, expected) in oracle {
        let got = published.get(column);
        // Compared as text: 1 and 1.0, 0 and -0 differ.
        if got.map(Json::to_string) != Some(expected.to_string()) {
            let shorten = |v: String| {
                if v.len() > 80 {
                    format!("{}...({} chars)", &v[..80], v.len())
                } else {
                    v
                }
            };
            failures
                .entry(format!("{table}.{column}"))
                .or_insert_with(|| {
                    format!(
                        "{what}: published {}, MariaDB says {}",
                        shorten(got.map_or("<missing>".into(), Json::to_string)),
                        shorten(expected.to_string())
                    )
                });
        }
    }
    for column in published.keys().filter(|c| !oracle.contains_key(*c)) {
        failures.insert(
            format!("{table}.{column}"),
            format!("{what}: a column MariaDB does not have"),
        );
    }
}

/// Checks a stream's changes of `table` against its history.
fn check_stream(
    failures: &mut BTreeMap<String, String>,
    format: &str,
    table: &str,
    history: &History,
    events: &[ChangeEvent],
) {
    // Each statement is its own transaction: group the changes by transaction end.
    let mut groups: Vec<Vec<&ChangeEvent>> = Vec::new();
    for event in events {
        match groups.last_mut() {
            Some(g)
                if (&g[0].binlog_file, g[0].binlog_pos)
                    == (&event.binlog_file, event.binlog_pos) =>
            {
                g.push(event)
            }
            _ => groups.push(vec![event]),
        }
    }
    assert_eq!(
        groups.len(),
        history.steps.len(),
        "{format} {table}: one transaction per statement that changed rows"
    );
    for ((statement, before, after), group) in history.steps.iter().zip(&groups) {
        let what = |e: &ChangeEvent| {
            format!(
                "{format} {} of key {} by `{}`",
                e.change.as_str(),
                e.key,
                &statement[..statement.len().min(60)]
            )
        };
        assert_eq!(
            group.len(),
            changes_in(before, after),
            "{format} {table}: changes of `{statement}`"
        );
        for event in group {
            let data = event.data.as_object().expect("data is an object");
            let key = data.get("id").map(|v| v.to_string()).unwrap_or_default();
            assert_eq!(event.key, key, "{format} {table}: the key is the id");
            match event.change {
                ChangeKind::Read => panic!("a read record in the stream: {}", what(event)),
                ChangeKind::Insert => {
                    assert!(
                        event.old.is_none() && !before.contains_key(&key),
                        "{}",
                        what(event)
                    );
                    compare(failures, &what(event), table, data, &after[&key]);
                }
                ChangeKind::Delete => {
                    assert!(
                        event.old.is_none() && !after.contains_key(&key),
                        "{}",
                        what(event)
                    );
                    compare(failures, &what(event), table, data, &before[&key]);
                }
                ChangeKind::Update => {
                    compare(failures, &what(event), table, data, &after[&key]);
                    let old = event
                        .old
                        .as_ref()
                        .and_then(Json::as_object)
                        .expect("an update has old");
                    let mut previous = data.clone();
                    previous.extend(old.clone());
                    let old_key = previous
                        .get("id")
                        .map(|v| v.to_string())
                        .unwrap_or_default();
                    let Some(oracle_before) = before.get(&old_key) else {
                        panic!("{}: no row {old_key} before it", what(event));
                    };
                    compare(
                        failures,
                        &format!("{} (data with old)", what(event)),
                        table,
                        &previous,
                        oracle_before,
                    );
                    // old holds exactly the columns that changed.
                    let changed: Vec<&String> = oracle_before
                        .iter()
                        .filter(|(c, v)| after[&key].get(*c) != Some(*v))
                        .map(|(c, _)| c)
                        .collect();
                    let old_columns: Vec<&String> = old.keys().collect();
                    if changed != old_columns && failures.get(&format!("{table}.<old>")).is_none() {
                        failures.insert(
                            format!("{table}.<old>"),
                            format!(
                                "{}: old has {old_columns:?}, changed were {changed:?}",
                                what(event)
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// `cdc` of every fixture table, json and avro at once, then `cdc snapshot`
/// of each table in both formats, all against MariaDB's own rendering.
#[tokio::test(flavor = "multi_thread")]
async fn every_column_type_arrives_as_mariadb_renders_it_in_json_avro_and_the_snapshot() {
    let mut source = Source::new(&[]).await;
    let histories = run_fixture(&source.database).await;
    let tables: Vec<&String> = histories.keys().collect();
    let db = source.database.clone();
    let prefix = source.env.prefix.clone();
    let table_args: Vec<String> = tables
        .iter()
        .flat_map(|t| ["--table".to_string(), format!("{db}.{t}")])
        .collect();
    let spawn = |env: &TestEnv, server_id: &str| {
        let mut args: Vec<&str> = vec![
            "cdc",
            "--server-id",
            server_id,
            "--start-position",
            &source.start,
        ];
        args.extend(table_args.iter().map(String::as_str));
        env.spawn(&args)
    };
    // The two formats: own names (transactional ids), topics and offsets.
    let format_env = |env: &mut TestEnv, format: &str| {
        let name = if format == "json" {
            prefix.clone()
        } else {
            format!("{prefix}-{format}")
        };
        env.set_env("ORDERPIPE_CDC__VALUE_FORMAT", format);
        env.set_env("ORDERPIPE_CDC__NAME", &name);
        env.set_env("ORDERPIPE_CDC__TOPIC_PREFIX", &format!("{prefix}.{format}"));
        env.set_env(
            "ORDERPIPE_CDC__OFFSETS_TOPIC",
            &format!("{prefix}.{format}.offsets"),
        );
    };
    let mut streams = Vec::new();
    for format in ["json", "avro"] {
        format_env(&mut source.env, format);
        streams.push(spawn(&source.env, &cdc_server_id()));
    }
    let mut failures = BTreeMap::new();
    let mut published: BTreeMap<&str, Vec<Vec<ChangeEvent>>> = BTreeMap::new();
    for (format, stream) in ["json", "avro"].into_iter().zip(&mut streams) {
        for table in &tables {
            let history = &histories[*table];
            let count = history.steps.iter().map(|(_, b, a)| changes_in(b, a)).sum();
            let topic = format!("{prefix}.{format}.{db}.{table}");
            match read_changes(&source.env, &topic, count, Some(stream)).await {
                Ok(events) => {
                    check_stream(&mut failures, format, table, history, &events);
                    published.entry(format).or_default().push(events);
                }
                Err(e) => {
                    failures.insert(format!("<{format} stream>"), e);
                    break;
                }
            }
        }
        // What differs so far, printed as it is found (the list of issue 24's closing note).
        eprintln!(
            "after the {format} stream: {} columns differ: {:#?}",
            failures.len(),
            failures
        );
    }
    for stream in &mut streams {
        if failures.keys().all(|k| !k.ends_with("stream>")) {
            assert!(matches!(stream.try_wait(), Ok(None)), "cdc still runs");
        }
        let _ = stream.kill();
    }
    // The two forms agree after decoding.
    let facts = |events: &Vec<ChangeEvent>| -> Vec<String> {
        events
            .iter()
            .map(|e| format!("{} {} {} {:?}", e.change.as_str(), e.key, e.data, e.old))
            .collect()
    };
    if let (Some(json), Some(avro)) = (published.get("json"), published.get("avro")) {
        for (json, avro) in json.iter().zip(avro) {
            assert_eq!(
                facts(json),
                facts(avro),
                "json and avro decode to the same changes"
            );
        }
    }
    // The snapshot of each table, in both formats: the final rows, as the stream wrote them.
    for format in ["json", "avro"] {
        format_env(&mut source.env, format);
        let snapshots: Vec<(String, String)> = tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                let runs: Vec<_> = tables
                    .iter()
                    .map(|table| {
                        let env = &source.env;
                        let (table, server_id) = (format!("{db}.{table}"), cdc_server_id());
                        let name = format!(
                            "{prefix}-{format}-snap-{}",
                            table.rsplit('.').next().unwrap()
                        );
                        scope.spawn(move || {
                            let args = [
                                "cdc",
                                "snapshot",
                                "--blocking",
                                "--table",
                                &table,
                                "--name",
                                &name,
                                "--server-id",
                                &server_id,
                            ];
                            (table.clone(), env.cli(&args).text())
                        })
                    })
                    .collect();
                runs.into_iter().map(|r| r.join().unwrap()).collect()
            })
        });
        for (i, table) in tables.iter().enumerate() {
            let (_, output) = &snapshots[i];
            let history = &histories[*table];
            let last = &history.steps.last().unwrap().2;
            let topic = format!("{prefix}.{format}.{db}.{table}");
            let none = Vec::new();
            let streamed = published
                .get(format)
                .and_then(|p| p.get(i))
                .unwrap_or(&none);
            // After the stream's changes (when it wrote them): the snapshot's rows.
            let Ok(all) =
                read_changes(&source.env, &topic, streamed.len() + last.len(), None).await
            else {
                failures.insert(format!("<{format} snapshot of {table}>"), output.clone());
                continue;
            };
            let snapshot: Vec<&ChangeEvent> = all
                .iter()
                .filter(|e| e.producer.contains("-snap-"))
                .collect();
            assert_eq!(
                snapshot.len(),
                last.len(),
                "{format} snapshot of {table}: every row once ({output})"
            );
            for event in snapshot {
                assert_eq!(event.change, ChangeKind::Insert);
                let data = event.data.as_object().unwrap();
                compare(
                    &mut failures,
                    &format!("{format} snapshot of key {}", event.key),
                    table,
                    data,
                    &last[&event.key],
                );
                // Byte for byte what the stream last wrote for the row.
                let streamed_last = streamed
                    .iter()
                    .rev()
                    .find(|e| e.key == event.key && e.change != ChangeKind::Delete);
                // As text: 1 and 1.0 are equal JSON values but not the same bytes.
                let text = |v: &Json| serde_json::to_string(v).unwrap();
                if let Some(streamed_last) =
                    streamed_last.filter(|s| text(&s.data) != text(&event.data))
                {
                    failures
                        .entry(format!("{table}.<snapshot>"))
                        .or_insert_with(|| {
                            format!(
                                "{format} key {}: snapshot {} vs stream {}",
                                event.key, event.data, streamed_last.data
                            )
                        });
                }
            }
        }
    }
    let report: Vec<String> = failures
        .iter()
        .map(|(column, why)| format!("{column}: {why}"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} columns differ from MariaDB:\n{}",
        failures.len(),
        report.join("\n")
    );
}
