//! [`Tx`]: a transaction that knows its backend, so whoever writes in it
//! asks it for a statement ([`Tx::sql`]) instead of being handed a dialect.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use sqlx::{AnyConnection, Transaction};

use super::{Dialect, Memo};

/// A transaction handed to stores and handlers: their writes commit or roll
/// back together (a handler's effect with the event's dedup row). It
/// dereferences to the connection, so `query.execute(&mut **tx)` runs in it.
#[derive(Debug)]
pub struct Tx {
    inner: Transaction<'static, sqlx::Any>,
    dialect: Dialect,
    memo: Arc<Memo>,
}

impl Tx {
    /// Wraps a transaction begun on a pool of `dialect`.
    pub fn new(inner: Transaction<'static, sqlx::Any>, dialect: Dialect, memo: Arc<Memo>) -> Self {
        Self {
            inner,
            dialect,
            memo,
        }
    }

    /// What the process remembers of the database's contents.
    pub fn memo(&self) -> &Memo {
        &self.memo
    }

    /// The backend's statements (see [`super::statements`]).
    pub fn sql(&self) -> Dialect {
        self.dialect
    }

    /// Gives up waiting for a row lock after `seconds` (the session's
    /// `innodb_lock_wait_timeout`, until the connection sets it again);
    /// nothing on SQLite, which has no row locks.
    pub async fn lock_wait_timeout(&mut self, seconds: u64) -> Result<(), sqlx::Error> {
        if self.dialect == Dialect::MySql {
            let sql =
                sqlx::AssertSqlSafe(format!("SET SESSION innodb_lock_wait_timeout = {seconds}"));
            sqlx::query(sql).execute(&mut *self.inner).await?;
        }
        Ok(())
    }

    /// Marks the point [`Tx::rollback_to_savepoint`] returns to (one at a
    /// time: a new one replaces the last). Sent as text: not every server
    /// prepares savepoint statements.
    pub async fn savepoint(&mut self) -> Result<(), sqlx::Error> {
        self.raw("SAVEPOINT orderpipe_step").await
    }

    /// Undoes everything written since [`Tx::savepoint`]; the transaction
    /// goes on (row locks taken meanwhile are kept until it ends).
    pub async fn rollback_to_savepoint(&mut self) -> Result<(), sqlx::Error> {
        self.raw("ROLLBACK TO SAVEPOINT orderpipe_step").await
    }

    /// Marks a second point, later than [`Tx::savepoint`]'s, that
    /// [`Tx::rollback_to_inner_savepoint`] returns to. Rolling back to the
    /// outer one drops it.
    pub async fn inner_savepoint(&mut self) -> Result<(), sqlx::Error> {
        self.raw("SAVEPOINT orderpipe_inner").await
    }

    /// Undoes everything written since [`Tx::inner_savepoint`], keeping
    /// what came before it.
    pub async fn rollback_to_inner_savepoint(&mut self) -> Result<(), sqlx::Error> {
        self.raw("ROLLBACK TO SAVEPOINT orderpipe_inner").await
    }

    async fn raw(&mut self, statement: &'static str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(statement)
            .execute(&mut *self.inner)
            .await
            .map(drop)
    }

    /// Commits.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.inner.commit().await
    }

    /// Rolls back.
    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.inner.rollback().await
    }
}

impl Deref for Tx {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        &self.inner
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.inner
    }
}
