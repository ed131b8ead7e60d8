//! The database: one pool for MariaDB/MySQL (production) or SQLite (the
//! embedded demo), the SQL dialect differences, and migrations from `sql/`.
//!
//! orderpipe writes portable SQL through `sqlx::Any`. Where the dialects
//! differ (`INSERT IGNORE` vs `INSERT OR IGNORE`, `FOR UPDATE`, `DELETE ...
//! LIMIT`, upserts) the text comes from [`statements`], the one place that
//! knows both: stores and handlers ask their [`Tx`] ([`Tx::sql`]) or
//! [`Db::sql`] for a statement and never branch on the backend.
//!
//! [`DatabaseSettings`] is the `[database]` section of the configuration.

use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::AnyPool;
use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::migrate::Migrator;

mod memo;
pub mod rows;
pub mod statements;
mod tx;

pub use memo::{Legacy, Memo};
pub use statements::Upsert;
pub use tx::Tx;

/// The `[database]` section of the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `mysql://user:pass@host:port/db` or `sqlite://path`.
    pub url: SecretString,
    /// Pool size; unset: [`DEFAULT_POOL`], and a consumer sizes its pool
    /// to its partition workers.
    #[serde(default)]
    pub max_connections: Option<u32>,
}

/// The pool size of a role when `database.max_connections` is unset.
pub const DEFAULT_POOL: u32 = 16;

impl DatabaseSettings {
    /// The pool size of a role that needs no more than the setting says.
    pub fn pool_size(&self) -> u32 {
        self.max_connections.unwrap_or(DEFAULT_POOL)
    }

    /// Rejects a URL of a database orderpipe does not speak.
    pub fn validate(&self) -> Result<(), String> {
        let url = self.url.expose_secret();
        if !url.starts_with("mysql://")
            && !url.starts_with("mariadb://")
            && !url.starts_with("sqlite:")
        {
            return Err("database.url must start with mysql://, mariadb:// or sqlite:".into());
        }
        Ok(())
    }
}

/// MariaDB/MySQL migrations.
static MYSQL_MIGRATIONS: Migrator = sqlx::migrate!("sql/mysql");
/// SQLite migrations.
static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("sql/sqlite");

/// Strict mode on top of whatever the server sets: a value too long for its
/// column is an error, never silently cut to fit (servers and managed
/// databases configured with `sql_mode = ''` otherwise truncate).
/// `INSERT IGNORE` still turns such errors into warnings, so values written
/// that way are checked before they get there ([`fits_column`]).
pub const STRICT_SESSION: &str =
    "SET SESSION sql_mode = CONCAT(@@SESSION.sql_mode, ',STRICT_TRANS_TABLES')";

/// Characters of a group name (`dedup_groups.name`, the `consumer_group` columns of
/// `dead_letters`, `parked_keys`, `held_records`: `sql/mysql/*.sql`).
pub const CONSUMER_GROUP_CHARS: usize = 255;

/// Characters of the `record_key` columns of `event_dedup`, `parked_keys`
/// and `held_records`.
pub const RECORD_KEY_CHARS: usize = 255;

/// Whether `value` fits a `VARCHAR(max_chars)` column as it is.
pub fn fits_column(value: &str, max_chars: usize) -> bool {
    value.chars().count() <= max_chars
}

/// Which SQL dialect the pool speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// MariaDB or MySQL.
    MySql,
    /// SQLite.
    Sqlite,
}

/// Database errors, split by whether waiting helps.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// Connection refused, timeout, lock wait: try again later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The transaction lost a deadlock or serialization conflict: run it again.
    #[error("transaction conflict: {0}")]
    Conflict(String),
    /// Anything else (bad SQL, constraint we did not expect).
    #[error("database error: {0}")]
    Other(String),
}

impl DbError {
    /// True when retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Conflict(_))
    }
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            let deadlock = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|m| m.number() == 1213)
                || db.code().as_deref() == Some("40001");
            if deadlock {
                return Self::Conflict(e.to_string());
            }
        }
        let retryable = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => true,
            sqlx::Error::Database(db) => {
                // MySQL: 1205 lock wait timeout, 1213 deadlock, 1040 too many
                // connections, 1053 shutdown, 1927 connection killed,
                // 2006/2013 server gone. SQLite: busy / locked.
                let mysql_transient = db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|e| matches!(e.number(), 1205 | 1040 | 1053 | 1927 | 2006 | 2013));
                let sqlstate_transient = db
                    .code()
                    .is_some_and(|c| c.starts_with("08") || c == "40001");
                mysql_transient
                    || sqlstate_transient
                    || db.message().contains("database is locked")
                    || db.message().contains("database table is locked")
            }
            _ => false,
        };
        if retryable {
            Self::Unavailable(e.to_string())
        } else {
            Self::Other(e.to_string())
        }
    }
}

/// A connection pool and its dialect.
#[derive(Clone, Debug)]
pub struct Db {
    /// The pool.
    pub pool: AnyPool,
    /// Its dialect.
    pub dialect: Dialect,
    /// What this process remembers of the database's contents.
    pub memo: Arc<Memo>,
}

impl Db {
    /// Connects (lazily: the first query opens connections, so a database
    /// that is down at start is retried like one that goes down later).
    pub fn connect(settings: &DatabaseSettings, max_connections: u32) -> Result<Self, DbError> {
        install_default_drivers();
        let url = settings.url.expose_secret();
        let dialect = if url.starts_with("sqlite:") {
            Dialect::Sqlite
        } else {
            Dialect::MySql
        };
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if dialect == Dialect::MySql {
                        // READ COMMITTED: no gap locks, so outbox inserts and the
                        // relay's claim do not deadlock; uniqueness still holds.
                        sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query(STRICT_SESSION).execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy(url)
            .map_err(DbError::from)?;
        Ok(Self {
            pool,
            dialect,
            memo: Arc::default(),
        })
    }

    /// Applies pending migrations from `sql/<dialect>/`.
    pub async fn migrate(&self) -> Result<(), DbError> {
        self.migrate_to(None).await
    }

    /// Applies pending migrations up to version `to` (all when None).
    pub async fn migrate_to(&self, to: Option<i64>) -> Result<(), DbError> {
        let migrator = match self.dialect {
            Dialect::MySql => &MYSQL_MIGRATIONS,
            Dialect::Sqlite => &SQLITE_MIGRATIONS,
        };
        match to {
            Some(version) => migrator.run_to(version, &self.pool).await,
            None => migrator.run(&self.pool).await,
        }
        .map_err(|e| DbError::Other(format!("migration failed: {e}")))
    }

    /// The backend's statements, for statements run on the pool (see [`statements`]).
    pub fn sql(&self) -> Dialect {
        self.dialect
    }

    /// Begins a transaction.
    pub async fn begin(&self) -> Result<Tx, DbError> {
        Ok(Tx::new(
            self.pool.begin().await?,
            self.dialect,
            self.memo.clone(),
        ))
    }

    /// A cheap round trip, for health checks.
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

/// A migrated SQLite database in a directory that lives as long as the
/// returned guard: the unit tests' database (MariaDB is the integration
/// tests' in `tests/it`).
#[cfg(test)]
pub async fn sqlite_for_test() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let settings = DatabaseSettings {
        url: format!("sqlite://{}/t.db?mode=rwc", dir.path().display()).into(),
        max_connections: Some(1),
    };
    let db = Db::connect(&settings, 1).unwrap();
    db.migrate().await.unwrap();
    (dir, db)
}
