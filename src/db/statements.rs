//! Every statement whose text differs between MariaDB/MySQL and SQLite.
//!
//! Stores and handlers ask a [`Dialect`] (usually through their
//! [`Tx`](super::Tx) or [`Db`](super::Db)) for the statement they need and
//! never branch on the backend themselves. The shapes:
//!
//! | method | MariaDB/MySQL | SQLite |
//! | --- | --- | --- |
//! | [`Dialect::insert_ignore`], [`Dialect::insert_ignore_verb`] | `INSERT IGNORE` | `INSERT OR IGNORE` |
//! | [`Dialect::locking`], [`Dialect::row_lock`] | `... FOR UPDATE` | as is (a writer locks the whole database) |
//! | [`Dialect::delete_limited`] | `DELETE ... LIMIT ?` | `DELETE ... WHERE key IN (SELECT key ... LIMIT ?)` |
//! | [`Dialect::upsert`], [`Dialect::on_duplicate`] | `ON DUPLICATE KEY UPDATE` (`IF(matching, VALUES(c), c)`) | `ON CONFLICT (...) DO UPDATE` (`WHERE matching`) |
//! | [`Dialect::upsert_newer`] | `IF(newer, VALUES(c), c)` per column | `DO UPDATE ... WHERE newer` |
//! | [`Dialect::integer`] | `CAST(... AS SIGNED)` | `CAST(... AS INTEGER)` |
//! | [`Tx::lock_wait_timeout`](super::Tx::lock_wait_timeout) | `innodb_lock_wait_timeout` | nothing (no row locks) |
//! | a set of keys to read, update or delete ([`super::rows`]) | `JSON_TABLE(?, '$[*]' COLUMNS (...))`, `UPDATE t JOIN`, `DELETE t FROM t JOIN` | `json_each(?)`, `UPDATE ... FROM`, `DELETE ... IN (SELECT ...)` |
//!
//! Every argument is a constant of the calling store (table and column
//! names, conditions with `?` placeholders), never user input.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::Dialect;

/// An insert that, on a duplicate key, takes the new row's values when the
/// new row comes later in a log (`position`) than the stored one: see
/// [`Dialect::upsert_newer`].
#[derive(Debug, Clone, Copy)]
pub struct Upsert {
    /// The table.
    pub table: &'static str,
    /// Inserted columns, comma-separated; one `?` each is bound in this order.
    pub columns: &'static str,
    /// The unique key a duplicate collides on, comma-separated.
    pub key: &'static str,
    /// Columns set to a constant when the new row is later (`status`, `'pending'`).
    pub reset: &'static [(&'static str, &'static str)],
    /// Columns that take the new row's value when it is later.
    pub take: &'static [&'static str],
    /// The log position: (partition column, offset column). A row is later
    /// when its partition differs or its offset is greater.
    pub position: (&'static str, &'static str),
}

impl Dialect {
    /// `INSERT IGNORE <rest>` / `INSERT OR IGNORE <rest>`; `rest` is
    /// `INTO table (...) VALUES (?, ...)`.
    pub fn insert_ignore(self, rest: &str) -> SqlStr {
        text(format!("{} {rest}", self.insert_ignore_verb()))
    }

    /// `INSERT IGNORE` / `INSERT OR IGNORE`, for multi-row statements
    /// ([`super::rows`]); both backends support `RETURNING` on it (MariaDB
    /// 10.5+, SQLite 3.35+), which lists only the rows actually inserted.
    pub fn insert_ignore_verb(self) -> &'static str {
        match self {
            Self::MySql => "INSERT IGNORE",
            Self::Sqlite => "INSERT OR IGNORE",
        }
    }

    /// `select` with its rows locked until the transaction ends (`FOR
    /// UPDATE`); SQLite needs no row lock: a writer locks the whole database.
    pub fn locking(self, select: &str) -> SqlStr {
        text(format!("{select}{}", self.row_lock()))
    }

    /// The clause that ends a locking `SELECT` (see [`Dialect::locking`]),
    /// for statements put together with a `QueryBuilder`.
    pub fn row_lock(self) -> &'static str {
        match self {
            Self::MySql => " FOR UPDATE",
            Self::Sqlite => "",
        }
    }

    /// Deletes at most `?` rows of `table` matching `condition` (its
    /// placeholders are bound first, then the limit). SQLite has no
    /// `DELETE ... LIMIT`: it deletes by `key` (a unique column, or `rowid`).
    pub fn delete_limited(self, table: &str, key: &str, condition: &str) -> SqlStr {
        match self {
            Self::MySql => text(format!("DELETE FROM {table} WHERE {condition} LIMIT ?")),
            Self::Sqlite => text(format!(
                "DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {condition} LIMIT ?)"
            )),
        }
    }

    /// Inserts a row (`columns`, one `?` each) or, on a duplicate `key`,
    /// sets `update` to the new row's values.
    pub fn upsert(self, table: &str, columns: &str, key: &str, update: &[&str]) -> SqlStr {
        text(format!(
            "INSERT INTO {table} ({columns}) VALUES ({}){}",
            placeholders(columns),
            self.on_duplicate(table, key, update, &[])
        ))
    }

    /// The clause that ends an insert into `table` (of one row or many):
    /// on a duplicate `key`, `update` takes the new row's values; with
    /// `matching` groups of columns, only where the stored row equals the
    /// new one on every column of a group (a NULL equals nothing).
    pub fn on_duplicate(
        self,
        table: &str,
        key: &str,
        update: &[&str],
        matching: &[&[&str]],
    ) -> String {
        let condition = |old: &dyn Fn(&str) -> String, new: &dyn Fn(&str) -> String| {
            matching
                .iter()
                .map(|group| {
                    let equal: Vec<String> = group
                        .iter()
                        .map(|c| format!("{} = {}", old(c), new(c)))
                        .collect();
                    format!("({})", equal.join(" AND "))
                })
                .collect::<Vec<_>>()
                .join(" OR ")
        };
        match self {
            Self::MySql => {
                let new = |c: &str| format!("VALUES({c})");
                let when = condition(&|c| c.to_string(), &new);
                // Assignments run left to right on the updated row, but the
                // condition cannot change on the way: if a group matched,
                // every assignment keeps it matching; if none did, nothing
                // is assigned.
                let set: Vec<String> = update
                    .iter()
                    .map(|c| match matching {
                        [] => format!("{c} = {}", new(c)),
                        _ => format!("{c} = IF({when}, {}, {c})", new(c)),
                    })
                    .collect();
                format!(" ON DUPLICATE KEY UPDATE {}", set.join(", "))
            }
            Self::Sqlite => {
                let new = |c: &str| format!("excluded.{c}");
                let set: Vec<String> = update.iter().map(|c| format!("{c} = {}", new(c))).collect();
                let when = match matching {
                    [] => String::new(),
                    _ => format!(" WHERE {}", condition(&|c| format!("{table}.{c}"), &new)),
                };
                format!(
                    " ON CONFLICT ({key}) DO UPDATE SET {}{when}",
                    set.join(", ")
                )
            }
        }
    }

    /// The statement of an [`Upsert`]: a duplicate that comes later in the
    /// log than the stored row (another partition, or a greater offset)
    /// replaces the `reset` and `take` columns and the position; an earlier
    /// or equal one (a re-read) changes nothing.
    pub fn upsert_newer(self, u: &Upsert) -> SqlStr {
        let insert = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            u.table,
            u.columns,
            placeholders(u.columns)
        );
        let (partition, offset) = u.position;
        match self {
            Self::MySql => {
                // Assignments run left to right on the updated row: the
                // position columns come last, so every condition sees the old one.
                let newer =
                    format!("VALUES({offset}) > {offset} OR VALUES({partition}) <> {partition}");
                let reset = u
                    .reset
                    .iter()
                    .map(|(c, v)| format!("{c} = IF({newer}, {v}, {c})"));
                let take = u
                    .take
                    .iter()
                    .map(|c| format!("{c} = IF({newer}, VALUES({c}), {c})"));
                let set: Vec<String> = reset.chain(take).collect();
                text(format!(
                    "{insert} ON DUPLICATE KEY UPDATE {}, {partition} = VALUES({partition}), \
                     {offset} = GREATEST({offset}, VALUES({offset}))",
                    set.join(", ")
                ))
            }
            Self::Sqlite => {
                let reset = u.reset.iter().map(|(c, v)| format!("{c} = {v}"));
                let take = u
                    .take
                    .iter()
                    .chain([&partition, &offset])
                    .map(|c| format!("{c} = excluded.{c}"));
                let set: Vec<String> = reset.chain(take).collect();
                text(format!(
                    "{insert} ON CONFLICT ({}) DO UPDATE SET {} WHERE excluded.{offset} > {table}.{offset} \
                     OR excluded.{partition} <> {table}.{partition}",
                    u.key,
                    set.join(", "),
                    table = u.table
                ))
            }
        }
    }

    /// `SELECT COUNT(*)` of the tables of the database named `?`: 1 when
    /// it exists, 0 when not.
    pub fn table_exists(self) -> SqlStr {
        text(
            match self {
                Self::MySql => "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
                Self::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
            }
            .to_string(),
        )
    }

    /// `expr` as a 64-bit integer (MySQL's `SUM` is a DECIMAL).
    pub fn integer(self, expr: &str) -> String {
        match self {
            Self::MySql => format!("CAST({expr} AS SIGNED)"),
            Self::Sqlite => format!("CAST({expr} AS INTEGER)"),
        }
    }
}

/// A statement built from constants (see the module doc).
fn text(sql: String) -> SqlStr {
    AssertSqlSafe(sql).into_sql_str()
}

/// `?, ?, ...`, one per comma-separated column.
fn placeholders(columns: &str) -> String {
    vec!["?"; columns.split(',').count()].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEAD_LETTER: Upsert = Upsert {
        table: "t",
        columns: "k, p, o, e",
        key: "k",
        reset: &[("status", "'pending'")],
        take: &["e"],
        position: ("p", "o"),
    };

    #[test]
    fn each_backend_gets_its_own_text() {
        let sql = |s: SqlStr| s.as_str().to_owned();
        assert_eq!(
            sql(Dialect::MySql.insert_ignore("INTO t (a) VALUES (?)")),
            "INSERT IGNORE INTO t (a) VALUES (?)"
        );
        assert_eq!(
            sql(Dialect::Sqlite.insert_ignore("INTO t (a) VALUES (?)")),
            "INSERT OR IGNORE INTO t (a) VALUES (?)"
        );
        assert_eq!(
            sql(Dialect::MySql.locking("SELECT a FROM t")),
            "SELECT a FROM t FOR UPDATE"
        );
        assert_eq!(
            sql(Dialect::Sqlite.locking("SELECT a FROM t")),
            "SELECT a FROM t"
        );
        assert_eq!(
            sql(Dialect::MySql.delete_limited("t", "id", "a < ?")),
            "DELETE FROM t WHERE a < ? LIMIT ?"
        );
        assert_eq!(
            sql(Dialect::Sqlite.delete_limited("t", "id", "a < ?")),
            "DELETE FROM t WHERE id IN (SELECT id FROM t WHERE a < ? LIMIT ?)"
        );
        assert_eq!(
            sql(Dialect::MySql.upsert("t", "k, v", "k", &["v"])),
            "INSERT INTO t (k, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v)"
        );
        assert_eq!(
            sql(Dialect::Sqlite.upsert("t", "k, v", "k", &["v"])),
            "INSERT INTO t (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
        );
    }

    #[test]
    fn an_upsert_on_matching_columns_keeps_other_rows_on_both_backends() {
        let matching: &[&[&str]] = &[&["a", "b"], &["e"]];
        assert_eq!(
            Dialect::MySql.on_duplicate("t", "k", &["a", "v"], matching),
            " ON DUPLICATE KEY UPDATE a = IF((a = VALUES(a) AND b = VALUES(b)) OR (e = VALUES(e)), VALUES(a), a), \
             v = IF((a = VALUES(a) AND b = VALUES(b)) OR (e = VALUES(e)), VALUES(v), v)"
        );
        assert_eq!(
            Dialect::Sqlite.on_duplicate("t", "k", &["a", "v"], matching),
            " ON CONFLICT (k) DO UPDATE SET a = excluded.a, v = excluded.v \
             WHERE (t.a = excluded.a AND t.b = excluded.b) OR (t.e = excluded.e)"
        );
    }

    #[test]
    fn an_upsert_of_a_later_row_sets_the_position_last_on_mysql() {
        let newer = "VALUES(o) > o OR VALUES(p) <> p";
        assert_eq!(
            Dialect::MySql.upsert_newer(&DEAD_LETTER).as_str(),
            format!(
                "INSERT INTO t (k, p, o, e) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE status = IF({newer}, 'pending', status), \
                 e = IF({newer}, VALUES(e), e), p = VALUES(p), o = GREATEST(o, VALUES(o))"
            )
        );
        assert_eq!(
            Dialect::Sqlite.upsert_newer(&DEAD_LETTER).as_str(),
            "INSERT INTO t (k, p, o, e) VALUES (?, ?, ?, ?) ON CONFLICT (k) DO UPDATE SET status = 'pending', \
             e = excluded.e, p = excluded.p, o = excluded.o WHERE excluded.o > t.o OR excluded.p <> t.p"
        );
    }
}
