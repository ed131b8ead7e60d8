//! Multi-row statements: one statement writes or reads a whole set of rows
//! (a batch's dedup rows, a handler's effects), instead of one round trip
//! per row.
//!
//! **Reads, updates and deletes by key** take the set as **one JSON
//! parameter**, read back as a table (`JSON_TABLE` on MariaDB, `json_each`
//! on SQLite; [`JsonRows`]), so one statement serves a set of any size and
//! its text (prepared once per connection) does not depend on the size.
//! Text columns are `VARCHAR`s unless a value is too long for one, which
//! the server reads faster. Key lists are joined, not `IN (SELECT ...)`,
//! because MariaDB plans a single-table `UPDATE`/`DELETE` with an `IN`
//! subquery as a scan.
//!
//! **Inserts** are `VALUES` lists cut into power-of-two [`pieces`] (a few
//! statement shapes), never an `INSERT ... SELECT` of such a table: on
//! MariaDB's default `innodb_autoinc_lock_mode = 1`, an `INSERT ... SELECT`
//! into a table with an `AUTO_INCREMENT` column holds the table's AUTO-INC
//! lock until it ends, so one insert waiting on a row lock (a partition
//! stalled on the database) would hold back every insert into that table:
//! the other partitions' and the application's own. A `VALUES` insert
//! takes that lock only while it counts its rows (`tests/it`'s `db_rows`
//! and `dispatch` check both sides).
//!
//! Padding a `VALUES` list up to a fixed shape by repeating a row is not an
//! option: a repeated row is a duplicate key to `INSERT IGNORE`, which locks
//! the gap before it (a shared next-key lock), and batches of concurrent
//! workers then deadlock on each other's gaps (measured: 30 deadlocks in
//! one short test run).
//!
//! Every table, column and condition passed here is a constant of the
//! calling store, never user input; values are always bound.

use sqlx::any::AnyRow;
use sqlx::{Any, QueryBuilder};

use super::{Dialect, Tx};

/// Rows per statement, at most.
pub const MAX_ROWS: usize = 512;

/// Appends ` IN (?, ...)` with one bound value per item: the id and key
/// lists the stores send. Each length is a statement text of its own:
/// hot paths cut a list into [`pieces`] first (a few shapes to prepare),
/// and no list goes past [`MAX_PLACEHOLDERS`].
pub fn push_in<'t, T>(query: &mut QueryBuilder<Any>, values: impl IntoIterator<Item = T>)
where
    T: sqlx::Encode<'t, Any> + sqlx::Type<Any>,
{
    query.push(" IN (");
    let mut list = query.separated(", ");
    for value in values {
        list.push_bind(value);
    }
    query.push(")");
}

/// `rows` cut into pieces whose sizes are powers of two, at most
/// [`MAX_ROWS`], largest first (the binary digits of the count).
pub fn pieces<T>(rows: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let size = MAX_ROWS.min(1 << rest.len().ilog2());
        let (piece, tail) = rest.split_at(size);
        rest = tail;
        Some(piece)
    })
}

/// The values this crate binds into multi-row statements.
#[derive(Debug, Clone, Copy)]
pub enum Bound<'a> {
    /// An integer.
    Int(i64),
    /// A text.
    Text(&'a str),
    /// A text or NULL.
    MaybeText(Option<&'a str>),
    /// Bytes (a `BINARY` / `BLOB` column).
    Bytes(&'a [u8]),
}

/// Binds `value` at the builder's end.
fn bind(builder: &mut QueryBuilder<Any>, value: Bound<'_>) {
    match value {
        Bound::Int(v) => builder.push_bind(v),
        Bound::Text(v) => builder.push_bind(v),
        Bound::MaybeText(v) => builder.push_bind(v),
        Bound::Bytes(v) => builder.push_bind(v),
    };
}

/// `{verb} INTO {into} VALUES (...), ... RETURNING {returning}` for every
/// row (`values` gives a row's values, in the order of `into`'s columns),
/// in [`pieces`]: the rows the database returned, i.e. the ones actually
/// inserted, in the given order. `verb` is `INSERT IGNORE` or its
/// dialect's form ([`super::Dialect::insert_ignore_verb`]).
pub async fn insert_returning<'a, T>(
    tx: &mut Tx,
    verb: &str,
    into: &str,
    returning: &str,
    rows: &'a [T],
    values: impl Fn(&'a T) -> Vec<Bound<'a>>,
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let mut returned = Vec::new();
    for piece in pieces(rows) {
        let mut builder = insert_values(verb, into, piece, &values);
        builder.push(format!(" RETURNING {returning}"));
        returned.extend(builder.build().fetch_all(&mut **tx).await?);
    }
    Ok(returned)
}

/// `{verb} INTO {into} VALUES (...), ...{then}` for every row, in
/// [`pieces`] and in the given order, as [`insert_returning`] writes them
/// but without reading them back: the rows the statements affected. For
/// `INSERT IGNORE`, the rows a unique key did not keep out; for an upsert
/// (`then` being its [`Dialect::on_duplicate`](super::Dialect::on_duplicate)
/// clause; callers lock keys in their order, so two transactions lock rows
/// alike, and a key given twice updates last), MariaDB counts an updated
/// row twice.
pub async fn insert_pieces<'a, T>(
    tx: &mut Tx,
    verb: &str,
    into: &str,
    then: &str,
    rows: &'a [T],
    values: impl Fn(&'a T) -> Vec<Bound<'a>>,
) -> Result<u64, sqlx::Error> {
    let mut affected = 0;
    for piece in pieces(rows) {
        let mut builder = insert_values(verb, into, piece, &values);
        builder.push(then);
        affected += builder.build().execute(&mut **tx).await?.rows_affected();
    }
    Ok(affected)
}

/// Values one statement may bind, at most: SQLite's limit (MariaDB's and
/// MySQL's on a prepared statement is 65,535).
pub const MAX_PLACEHOLDERS: usize = 32_766;

/// `{verb} INTO {into} VALUES (...), ...` for every row, in as few
/// statements as [`MAX_PLACEHOLDERS`] allows (`columns`: values per row);
/// returns how many rows the database inserted. Unlike
/// [`insert_returning`], a set is not cut into a few fixed shapes: each
/// size is a statement text of its own, prepared once per connection. For
/// the harness's bulk writes (the benchmarks' database ceiling), whose sets
/// have one or two sizes.
pub async fn insert_all<'a, T>(
    tx: &mut Tx,
    verb: &str,
    into: &str,
    columns: usize,
    rows: &'a [T],
    values: impl Fn(&'a T) -> Vec<Bound<'a>>,
) -> Result<u64, sqlx::Error> {
    let mut inserted = 0;
    for chunk in rows.chunks((MAX_PLACEHOLDERS / columns.max(1)).max(1)) {
        let mut builder = insert_values(verb, into, chunk, &values);
        inserted += builder.build().execute(&mut **tx).await?.rows_affected();
    }
    Ok(inserted)
}

/// `{verb} INTO {into} VALUES (...), ...` with every row of `chunk` bound.
fn insert_values<'a, T>(
    verb: &str,
    into: &str,
    chunk: &'a [T],
    values: &impl Fn(&'a T) -> Vec<Bound<'a>>,
) -> QueryBuilder<Any> {
    let mut builder: QueryBuilder<Any> = QueryBuilder::new(format!("{verb} INTO {into} VALUES "));
    for (r, item) in chunk.iter().enumerate() {
        builder.push(if r == 0 { "(" } else { ", (" });
        for (v, value) in values(item).into_iter().enumerate() {
            if v > 0 {
                builder.push(", ");
            }
            bind(&mut builder, value);
        }
        builder.push(")");
    }
    builder
}

/// `DELETE FROM {table} WHERE {key} IN (keys)`, in one statement; returns
/// how many rows went.
pub async fn delete_in(
    tx: &mut Tx,
    table: &str,
    key: &str,
    keys: &[i64],
) -> Result<u64, sqlx::Error> {
    if keys.is_empty() {
        return Ok(0);
    }
    let set = JsonRows::keys(keys);
    let mut builder = QueryBuilder::new(match tx.sql() {
        Dialect::MySql => format!("DELETE {table} FROM {table} JOIN "),
        Dialect::Sqlite => format!("DELETE FROM {table} WHERE {key} IN (SELECT "),
    });
    match tx.sql() {
        Dialect::MySql => {
            set.push_table(&mut builder, Dialect::MySql);
            builder.push(format!(
                " ON {table}.{key} = {}",
                set.column(Dialect::MySql, 0)
            ));
        }
        Dialect::Sqlite => {
            builder.push(set.column(Dialect::Sqlite, 0)).push(" FROM ");
            set.push_table(&mut builder, Dialect::Sqlite);
            builder.push(")");
        }
    }
    Ok(builder.build().execute(&mut **tx).await?.rows_affected())
}

/// `{select} WHERE {key} IN (keys){and}`, in one statement: the rows found.
/// `select` is `SELECT ... FROM table` (its column names unqualified and
/// none named `j_*`), `and` is empty or ` AND ...` with no placeholders.
pub async fn select_in(
    tx: &mut Tx,
    select: &str,
    key: &str,
    and: &str,
    keys: &[i64],
) -> Result<Vec<AnyRow>, sqlx::Error> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (dialect, set) = (tx.sql(), JsonRows::keys(keys));
    let mut builder: QueryBuilder<Any> = QueryBuilder::new(format!("{select} JOIN "));
    set.push_table(&mut builder, dialect);
    builder.push(format!(
        " ON {key} = {} WHERE 1 = 1{and}",
        set.column(dialect, 0)
    ));
    builder.build().fetch_all(&mut **tx).await
}

/// `UPDATE {table} SET {column} = value WHERE {key} IN (keys){and}`, in one
/// statement; returns how many rows changed. `and` is empty or ` AND ...`
/// with no placeholders.
pub async fn update_in(
    tx: &mut Tx,
    table: &str,
    column: &str,
    value: Bound<'_>,
    key: &str,
    and: &str,
    keys: &[i64],
) -> Result<u64, sqlx::Error> {
    if keys.is_empty() {
        return Ok(0);
    }
    let set = format!("{column} = ");
    let condition = format!("1 = 1{and}");
    let keys = JsonRows::keys(keys);
    update_join(tx, table, key, &keys, (&set, Some(value)), &[], &condition).await
}

/// Sets each row's own values on the rows matching its key, in one
/// statement: `UPDATE {table} SET {fixed}, c = <the row's value>, ... WHERE
/// {key} = <the row's key> AND {condition}`. `rows` are `(key, values of
/// columns)`; returns how many rows changed.
pub async fn update_each<'a>(
    tx: &mut Tx,
    table: &str,
    fixed: &str,
    columns: &[&str],
    key: &str,
    condition: &str,
    rows: &'a [(i64, Vec<Bound<'a>>)],
) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let set = JsonRows::of(rows, |(k, values)| {
        std::iter::once(Bound::Int(*k))
            .chain(values.iter().copied())
            .collect()
    });
    update_join(tx, table, key, &set, (fixed, None), columns, condition).await
}

/// The `UPDATE` of [`update_in`] and [`update_each`]: `table` joined with
/// `set` on its first column (`key`), setting `fixed` (followed by the bound
/// value when there is one) and then each of `columns` to the set's next
/// columns, where `condition` holds.
async fn update_join(
    tx: &mut Tx,
    table: &str,
    key: &str,
    set: &JsonRows,
    (fixed, value): (&str, Option<Bound<'_>>),
    columns: &[&str],
    condition: &str,
) -> Result<u64, sqlx::Error> {
    let dialect = tx.sql();
    let mut builder = QueryBuilder::new(format!("UPDATE {table} "));
    // MariaDB: UPDATE t JOIN set ON ... SET ...; SQLite: UPDATE t SET ... FROM set.
    if dialect == Dialect::MySql {
        builder.push("JOIN ");
        set.push_table(&mut builder, dialect);
        builder.push(format!(" ON {table}.{key} = {} ", set.column(dialect, 0)));
    }
    builder.push(format!("SET {fixed}"));
    if let Some(value) = value {
        bind(&mut builder, value);
    }
    for (c, column) in columns.iter().enumerate() {
        builder.push(format!(", {column} = {}", set.column(dialect, c + 1)));
    }
    if dialect == Dialect::Sqlite {
        builder.push(" FROM ");
        set.push_table(&mut builder, dialect);
        builder.push(format!(
            " WHERE {table}.{key} = {} AND ",
            set.column(dialect, 0)
        ));
    } else {
        builder.push(" WHERE ");
    }
    builder.push(condition);
    Ok(builder.build().execute(&mut **tx).await?.rows_affected())
}

/// A set of rows as one JSON parameter (an array of arrays) that the
/// statement reads as the table `j`: `JSON_TABLE` on MariaDB, `json_each`
/// on SQLite. Bytes travel as hex and are unhexed in the statement.
struct JsonRows {
    /// The JSON array, bound as the statement's one parameter for the set.
    doc: String,
    /// Each column's kind, from the first row's values.
    kinds: Vec<Kind>,
    /// Each column's longest value in the JSON, in bytes.
    widths: Vec<usize>,
}

/// The longest text a `VARCHAR` column of the set may carry (MariaDB's
/// largest utf8mb4 `VARCHAR`, in characters; a byte count is never less).
const MAX_VARCHAR: usize = 16_383;

/// How a column travels in the JSON and is read back.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Int,
    Text,
    Bytes,
}

impl JsonRows {
    /// The set of `rows`, each row's values given by `values`.
    fn of<'a, T>(rows: &'a [T], values: impl Fn(&'a T) -> Vec<Bound<'a>>) -> Self {
        let mut doc = Vec::with_capacity(rows.len() * 64);
        let (mut kinds, mut widths) = (Vec::new(), Vec::new());
        doc.push(b'[');
        for (r, row) in rows.iter().enumerate() {
            doc.extend_from_slice(if r == 0 { b"[" } else { b",[" });
            for (v, value) in values(row).into_iter().enumerate() {
                if v > 0 {
                    doc.push(b',');
                }
                let start = doc.len();
                let kind = push_json(&mut doc, value);
                let width = doc.len() - start;
                if r == 0 {
                    kinds.push(kind);
                    widths.push(width);
                }
                widths[v] = widths[v].max(width);
                debug_assert_eq!(kinds.get(v), Some(&kind), "column {v} changes kind");
            }
            doc.push(b']');
        }
        doc.push(b']');
        let doc = String::from_utf8(doc).expect("JSON text of UTF-8 strings and digits");
        Self { doc, kinds, widths }
    }

    /// A set of keys, distinct (a key list is a condition, not rows).
    fn keys(keys: &[i64]) -> Self {
        let mut distinct = keys.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        Self::of(&distinct, |&k| vec![Bound::Int(k)])
    }

    /// Pushes the set as the table `j`, binding its JSON.
    fn push_table(&self, builder: &mut QueryBuilder<Any>, dialect: Dialect) {
        match dialect {
            Dialect::MySql => {
                builder.push("JSON_TABLE(").push_bind(self.doc.clone());
                builder.push(", '$[*]' COLUMNS (");
                for (i, kind) in self.kinds.iter().enumerate() {
                    // A VARCHAR is read faster than a LONGTEXT (measured:
                    // 31–34 against 37 µs of MariaDB CPU per event), but it
                    // would cut a longer value without an error.
                    let sql_type = match kind {
                        Kind::Int => "BIGINT",
                        Kind::Text | Kind::Bytes if self.widths[i] <= MAX_VARCHAR => {
                            "VARCHAR(16383)"
                        }
                        Kind::Text | Kind::Bytes => "LONGTEXT",
                    };
                    let comma = if i == 0 { "" } else { ", " };
                    builder.push(format!(
                        "{comma}j_{i} {sql_type} PATH '$[{i}]' ERROR ON ERROR"
                    ));
                }
                builder.push(")) AS j");
            }
            Dialect::Sqlite => {
                // Renamed: json_each's own columns (`id`, `key`, `value`,
                // ...) would clash with the joined table's.
                builder.push("(SELECT value AS j_v FROM json_each(");
                builder.push_bind(self.doc.clone()).push(")) AS j");
            }
        }
    }

    /// Column `i` of the table `j`, as the value it carries.
    fn column(&self, dialect: Dialect, i: usize) -> String {
        let plain = match dialect {
            Dialect::MySql => format!("j.j_{i}"),
            Dialect::Sqlite => format!("json_extract(j.j_v, '$[{i}]')"),
        };
        match self.kinds[i] {
            Kind::Bytes => format!("UNHEX({plain})"),
            Kind::Int | Kind::Text => plain,
        }
    }
}

/// Writes `value` as JSON at the end of `doc`; returns its column's kind.
fn push_json(doc: &mut Vec<u8>, value: Bound<'_>) -> Kind {
    let string = |doc: &mut Vec<u8>, text: &str| {
        serde_json::to_writer(&mut *doc, text).expect("a string serializes into memory");
    };
    match value {
        Bound::Int(v) => {
            doc.extend_from_slice(v.to_string().as_bytes());
            Kind::Int
        }
        Bound::Text(v) => {
            string(doc, v);
            Kind::Text
        }
        Bound::MaybeText(v) => {
            match v {
                Some(v) => string(doc, v),
                None => doc.extend_from_slice(b"null"),
            }
            Kind::Text
        }
        Bound::Bytes(v) => {
            string(doc, &crate::hex::lower(v));
            Kind::Bytes
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_cut_into_power_of_two_pieces_of_ten_shapes() {
        let rows: Vec<u32> = (0..1300).collect();
        let sizes = |n: usize| pieces(&rows[..n]).map(<[u32]>::len).collect::<Vec<_>>();
        assert_eq!(sizes(300), [256, 32, 8, 4]);
        assert_eq!(sizes(1300), [512, 512, 256, 16, 4]);
        assert_eq!(sizes(1), [1]);
        assert!(sizes(0).is_empty());
        // In order, nothing lost or repeated.
        assert_eq!(
            pieces(&rows[..777]).flatten().copied().collect::<Vec<_>>(),
            rows[..777]
        );
        let shapes: std::collections::BTreeSet<usize> = (1..=1300).flat_map(sizes).collect();
        assert_eq!(shapes.len(), 10);
    }

    #[tokio::test]
    async fn insert_all_writes_a_set_past_the_placeholder_limit_and_ignores_what_exists() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        // 3 values a row: 10,922 rows a statement, so two statements.
        let ids: Vec<String> = (0..11_000).map(|i| format!("event-{i}")).collect();
        let insert = |ids: &[String]| {
            let db = db.clone();
            let ids = ids.to_vec();
            async move {
                let mut tx = db.begin().await.unwrap();
                let verb = tx.sql().insert_ignore_verb();
                let n = insert_all(
                    &mut tx,
                    verb,
                    "notifications (event_id, order_id, kind)",
                    3,
                    &ids,
                    |id| vec![Bound::Text(id), Bound::Int(7), Bound::Text("order.created")],
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
                n
            }
        };
        assert_eq!(insert(&ids).await, 11_000);
        // Present already: ignored, not counted; the new one is.
        assert_eq!(insert(&[ids[0].clone(), "event-new".into()]).await, 1);
        let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM notifications")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(count, 11_001);
    }
}
