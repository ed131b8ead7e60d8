-- The console's audit trail for the embedded default (SQLite); see sql/mysql/0013_console_audit.sql.
CREATE TABLE console_audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms      INTEGER NOT NULL,
    who        TEXT    NOT NULL,
    role       TEXT    NOT NULL,
    action     TEXT    NOT NULL,
    target     TEXT    NOT NULL,
    item_count INTEGER NOT NULL,
    outcome    TEXT    NOT NULL
);
CREATE INDEX idx_console_audit_at ON console_audit (at_ms);
