-- The log-based relay's lease (MariaDB/MySQL only: SQLite has no binlog);
-- kept so both schemas have the same tables.
CREATE TABLE relay_source_leases (
    source     TEXT    NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL,
    expires_ms INTEGER NOT NULL
);
