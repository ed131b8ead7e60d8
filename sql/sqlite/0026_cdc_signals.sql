-- Signals to a cdc source's incremental snapshots (see the MariaDB migration).
CREATE TABLE cdc_signals (
    id            INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    source        TEXT    NOT NULL,
    type          TEXT    NOT NULL,
    data          TEXT    NOT NULL,
    requested_by  TEXT    NOT NULL DEFAULT 'sql',
    created_at_ms INTEGER NOT NULL DEFAULT 0,
    applied_at_ms INTEGER NULL,
    outcome       TEXT    NULL
);
CREATE INDEX cdc_signals_source ON cdc_signals (source, id);
