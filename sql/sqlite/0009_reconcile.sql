-- Reconciliation runs for the embedded default (SQLite); see sql/mysql/0009_reconcile.sql.
CREATE TABLE reconcile_runs (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_group       TEXT    NOT NULL,
    topic                TEXT    NOT NULL,
    since_ms             INTEGER NOT NULL,
    until_ms             INTEGER NOT NULL,
    grace_ms             INTEGER NOT NULL,
    records              INTEGER NOT NULL,
    applied              INTEGER NOT NULL,
    dead_lettered        INTEGER NOT NULL,
    held                 INTEGER NOT NULL,
    parked               INTEGER NOT NULL,
    unconsumed           INTEGER NOT NULL,
    in_flight            INTEGER NOT NULL,
    missing              INTEGER NOT NULL,
    applied_not_in_topic INTEGER NOT NULL,
    oldest_missing_ms    INTEGER,
    started_ms           INTEGER NOT NULL,
    finished_ms          INTEGER NOT NULL
);
CREATE INDEX idx_reconcile_runs_group ON reconcile_runs (consumer_group, id);
CREATE INDEX idx_reconcile_runs_finished ON reconcile_runs (finished_ms);
