-- Dead letters for the embedded default (SQLite); see sql/mysql/0002_dead_letters.sql.
CREATE TABLE dead_letters (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_group     TEXT    NOT NULL,
    original_topic     TEXT    NOT NULL,
    original_partition INTEGER NOT NULL,
    original_offset    INTEGER NOT NULL,
    original_timestamp INTEGER,
    record_key         BLOB,
    payload            BLOB,
    headers            TEXT    NOT NULL,
    event_id           TEXT,
    event_name         TEXT,
    error_class        TEXT    NOT NULL,
    error_message      TEXT    NOT NULL,
    attempts           INTEGER NOT NULL,
    first_failure_ms   INTEGER NOT NULL,
    last_failure_ms    INTEGER NOT NULL,
    status             TEXT    NOT NULL DEFAULT 'pending',
    replay_count       INTEGER NOT NULL DEFAULT 0,
    last_replayed_ms   INTEGER,
    ignored_reason     TEXT,
    dlq_partition      INTEGER NOT NULL,
    dlq_offset         INTEGER NOT NULL,
    created_ms         INTEGER NOT NULL,
    updated_ms         INTEGER NOT NULL,
    UNIQUE (consumer_group, original_topic, original_partition, original_offset)
);
CREATE INDEX idx_dead_letters_status ON dead_letters (status, consumer_group);
CREATE INDEX idx_dead_letters_last_failure ON dead_letters (last_failure_ms);
