-- Bulk replays of dead letters, as they run: see sql/mysql/0015.
CREATE TABLE dlq_replays (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    origin      TEXT    NOT NULL,
    started_by  TEXT    NOT NULL,
    selection   TEXT    NOT NULL,
    total       INTEGER NOT NULL,
    settled     INTEGER NOT NULL DEFAULT 0,
    replayed    INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    state       TEXT    NOT NULL,
    error       TEXT,
    started_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    finished_ms INTEGER
);
CREATE INDEX idx_dlq_replays_state ON dlq_replays (state, started_ms);
