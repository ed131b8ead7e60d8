//! Multi-row statements in a few fixed shapes: one statement writes or
//! reads a whole set of rows (a batch's dedup rows, a handler's effects),
//! instead of one round trip per row.
//!
//! A statement's text depends on its row count, and the database prepares
//! each text once per connection. So that a handful of prepared statements
//! serve every batch size, a set is cut into chunks of at most [`MAX_ROWS`]
//! rows and each chunk is padded up to a power of two by repeating its last
//! row: ten shapes per statement. A repeated row changes nothing: an
//! `INSERT IGNORE` skips it as a duplicate (and `RETURNING` does not list
//! it), an `IN (...)` list or a `CASE` does not care.
//!
//! Every table, column and condition passed here is a constant of the
//! calling store, never user input; values are always bound.

use sqlx::any::AnyRow;
use sqlx::{Any, QueryBuilder};

use super::Tx;

/// Rows per statement, at most.
pub const MAX_ROWS: usize = 512;

/// The padded row count of a chunk of `n` rows (1 ≤ n ≤ [`MAX_ROWS`]).
pub fn shape(n: usize) -> usize {
    n.next_power_of_two().min(MAX_ROWS)
}

/// `rows` in chunks of at most [`MAX_ROWS`], each padded to its [`shape`]
/// by repeating its last row.
pub fn padded_chunks<T>(rows: &[T]) -> impl Iterator<Item = Vec<&T>> {
    rows.chunks(MAX_ROWS).map(|chunk| {
        let last = chunk.last().expect("chunks are never empty");
        chunk.iter().chain(std::iter::repeat_n(last, shape(chunk.len()) - chunk.len())).collect()
    })
}

/// The values this crate binds into multi-row statements.
#[derive(Debug, Clone, Copy)]
pub enum Bound<'a> {
    /// An integer.
    Int(i64),
    /// A text.
    Text(&'a str),
}

/// Binds `value` at the builder's end.
fn bind(builder: &mut QueryBuilder<Any>, value: Bound<'_>) {
    match value {
        Bound::Int(v) => builder.push_bind(v),
        Bound::Text(v) => builder.push_bind(v),
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
    for chunk in padded_chunks(rows) {
        let mut builder: QueryBuilder<Any> = QueryBuilder::new(format!("{verb} INTO {into} VALUES "));
        for (r, item) in chunk.into_iter().enumerate() {
            builder.push(if r == 0 { "(" } else { ", (" });
            for (v, value) in values(item).into_iter().enumerate() {
                if v > 0 {
                    builder.push(", ");
                }
                bind(&mut builder, value);
            }
            builder.push(")");
        }
        builder.push(format!(" RETURNING {returning}"));
        returned.extend(builder.build().fetch_all(&mut **tx).await?);
    }
    Ok(returned)
}

/// `{select} WHERE {key} IN (...){and}` for every key: the rows found.
/// `select` is `SELECT ... FROM table`, `and` is empty or ` AND ...` with
/// no placeholders.
pub async fn select_in(tx: &mut Tx, select: &str, key: &str, and: &str, keys: &[i64]) -> Result<Vec<AnyRow>, sqlx::Error> {
    let mut found = Vec::new();
    for chunk in padded_chunks(keys) {
        let mut builder: QueryBuilder<Any> = QueryBuilder::new(format!("{select} WHERE {key} IN ("));
        bind_list(&mut builder, chunk.into_iter().copied());
        builder.push(format!("){and}"));
        found.extend(builder.build().fetch_all(&mut **tx).await?);
    }
    Ok(found)
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
    for chunk in padded_chunks(rows) {
        let mut builder: QueryBuilder<Any> = QueryBuilder::new(format!("UPDATE {table} SET {fixed}"));
        for (c, column) in columns.iter().enumerate() {
            builder.push(format!(", {column} = CASE {key}"));
            for (k, values) in &chunk {
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
    fn chunks_are_padded_to_one_of_ten_shapes_by_repeating_the_last_row() {
        let shapes: std::collections::BTreeSet<usize> = (1..=MAX_ROWS).map(shape).collect();
        assert_eq!(shapes.len(), 10);
        let rows: Vec<u32> = (0..700).collect();
        let chunks: Vec<Vec<&u32>> = padded_chunks(&rows).collect();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].len(), 512);
        // 188 rows become 256: the last one repeated 68 times.
        assert_eq!(chunks[1].len(), 256);
        assert_eq!(*chunks[1][187], 699);
        assert!(chunks[1][188..].iter().all(|r| **r == 699));
        let three: Vec<Vec<&u32>> = padded_chunks(&rows[..3]).collect();
        assert_eq!(three[0].iter().map(|r| **r).collect::<Vec<_>>(), [0, 1, 2, 2]);
        assert_eq!(padded_chunks::<u32>(&[]).count(), 0);
    }
}
