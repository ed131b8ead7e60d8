//! Multi-row statements in a few fixed shapes: one statement writes or
//! reads a whole set of rows (a batch's dedup rows, a handler's effects),
//! instead of one round trip per row.
//!
//! A statement's text depends on its row count, and the database prepares
//! each text once per connection. So that a handful of prepared statements
//! serve every set size, a set is cut into pieces whose sizes are powers of
//! two up to [`MAX_ROWS`] (300 rows: 256 + 32 + 8 + 4): ten shapes per
//! statement, at most nine statements per 512 rows.
//!
//! Padding a set up to the next shape by repeating a row would keep one
//! statement per set, but a repeated row is a duplicate key to `INSERT
//! IGNORE`, which locks the gap before it (a shared next-key lock); batches
//! of concurrent workers then deadlock on each other's gaps of a unique
//! index (measured: 30 deadlocks in one short test run). So no padding.
//!
//! Every table, column and condition passed here is a constant of the
//! calling store, never user input; values are always bound.

use sqlx::any::AnyRow;
use sqlx::{Any, QueryBuilder};

use super::Tx;

/// Rows per statement, at most.
pub const MAX_ROWS: usize = 512;

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

/// Binds `keys` as a comma-separated list.
fn bind_list(builder: &mut QueryBuilder<Any>, keys: impl IntoIterator<Item = i64>) {
    for (i, key) in keys.into_iter().enumerate() {
        if i > 0 {
            builder.push(", ");
        }
        builder.push_bind(key);
    }
}

/// `{verb} INTO {into} VALUES (...), ... RETURNING {returning}` for every
/// row (`values` gives a row's values, in the order of `into`'s columns):
/// the rows the database returned, i.e. the ones actually inserted. `verb`
/// is `INSERT IGNORE` or its dialect's form ([`super::Dialect::insert_ignore_verb`]).
pub async fn insert_returning<'a, T>(
    tx: &mut Tx,
    verb: &str,
    into: &str,
    returning: &str,
    rows: &'a [T],
    values: impl Fn(&'a T) -> Vec<Bound<'a>>,
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let mut returned = Vec::new();
    for chunk in pieces(rows) {
        let mut builder = insert_values(verb, into, chunk, &values);
        builder.push(format!(" RETURNING {returning}"));
        returned.extend(builder.build().fetch_all(&mut **tx).await?);
    }
    Ok(returned)
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

/// `INSERT INTO {into} VALUES (...), ...{then}` for every row, in
/// [`pieces`]: the upsert of a set, `then` being its
/// [`Dialect::on_duplicate`](super::Dialect::on_duplicate) clause.
pub async fn upsert_all<'a, T>(
    tx: &mut Tx,
    into: &str,
    then: &str,
    rows: &'a [T],
    values: impl Fn(&'a T) -> Vec<Bound<'a>>,
) -> Result<(), sqlx::Error> {
    for piece in pieces(rows) {
        let mut builder = insert_values("INSERT", into, piece, &values);
        builder.push(then);
        builder.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// `DELETE FROM {table} WHERE {key} IN (...)` for every key; returns how
/// many rows went.
pub async fn delete_in(
    tx: &mut Tx,
    table: &str,
    key: &str,
    keys: &[i64],
) -> Result<u64, sqlx::Error> {
    execute_in(
        tx,
        || QueryBuilder::new(format!("DELETE FROM {table}")),
        key,
        "",
        keys,
    )
    .await
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

/// `{select} WHERE {key} IN (...){and}` for every key: the rows found.
/// `select` is `SELECT ... FROM table`, `and` is empty or ` AND ...` with
/// no placeholders.
pub async fn select_in(
    tx: &mut Tx,
    select: &str,
    key: &str,
    and: &str,
    keys: &[i64],
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let mut found = Vec::new();
    for chunk in pieces(keys) {
        let mut builder: QueryBuilder<Any> =
            QueryBuilder::new(format!("{select} WHERE {key} IN ("));
        bind_list(&mut builder, chunk.iter().copied());
        builder.push(format!("){and}"));
        found.extend(builder.build().fetch_all(&mut **tx).await?);
    }
    Ok(found)
}

/// `{update}? WHERE {key} IN (...){and}` for every key, `value` bound to
/// the `?` after `update` (e.g. `UPDATE t SET c = `); returns how many rows
/// changed. `and` is empty or ` AND ...` with no placeholders.
pub async fn update_in(
    tx: &mut Tx,
    update: &str,
    value: Bound<'_>,
    key: &str,
    and: &str,
    keys: &[i64],
) -> Result<u64, sqlx::Error> {
    let start = || {
        let mut builder = QueryBuilder::new(update);
        bind(&mut builder, value);
        builder
    };
    execute_in(tx, start, key, and, keys).await
}

/// `{start} WHERE {key} IN (...){and}` for every piece of `keys`, `start`
/// making each statement's head; returns how many rows it touched.
async fn execute_in(
    tx: &mut Tx,
    start: impl Fn() -> QueryBuilder<Any>,
    key: &str,
    and: &str,
    keys: &[i64],
) -> Result<u64, sqlx::Error> {
    let mut touched = 0;
    for chunk in pieces(keys) {
        let mut builder = start();
        builder.push(format!(" WHERE {key} IN ("));
        bind_list(&mut builder, chunk.iter().copied());
        builder.push(format!("){and}"));
        touched += builder.build().execute(&mut **tx).await?.rows_affected();
    }
    Ok(touched)
}

/// Sets each row's own values on the rows matching its key, in one
/// statement per chunk: `UPDATE {table} SET {fixed}, c = CASE {key} WHEN ?
/// THEN ? ... END, ... WHERE {key} IN (...) AND {condition}`. `rows` are
/// `(key, values of columns)`; returns how many rows changed.
pub async fn update_each<'a>(
    tx: &mut Tx,
    table: &str,
    fixed: &str,
    columns: &[&str],
    key: &str,
    condition: &str,
    rows: &'a [(i64, Vec<Bound<'a>>)],
) -> Result<u64, sqlx::Error> {
    let mut changed = 0;
    for chunk in pieces(rows) {
        let mut builder: QueryBuilder<Any> =
            QueryBuilder::new(format!("UPDATE {table} SET {fixed}"));
        for (c, column) in columns.iter().enumerate() {
            builder.push(format!(", {column} = CASE {key}"));
            for (k, values) in chunk {
                builder.push(" WHEN ").push_bind(*k).push(" THEN ");
                bind(&mut builder, values[c]);
            }
            builder.push(" END");
        }
        builder.push(format!(" WHERE {key} IN ("));
        bind_list(&mut builder, chunk.iter().map(|(k, _)| *k));
        builder.push(format!(") AND {condition}"));
        changed += builder.build().execute(&mut **tx).await?.rows_affected();
    }
    Ok(changed)
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
