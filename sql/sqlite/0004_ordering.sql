-- Per-order ordering for the embedded default (SQLite); see sql/mysql/0004_ordering.sql.
CREATE TABLE parked_keys (
    consumer_group  TEXT    NOT NULL,
    record_key      TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    head_origin     TEXT    NOT NULL,
    head_event_id   TEXT,
    head_event_name TEXT,
    state           TEXT    NOT NULL,
    parked_ms       INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    PRIMARY KEY (consumer_group, record_key)
);
CREATE INDEX idx_parked_keys_partition ON parked_keys (consumer_group, kafka_partition);

CREATE TABLE held_records (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_group   TEXT    NOT NULL,
    record_key       TEXT    NOT NULL,
    source_topic     TEXT    NOT NULL,
    source_partition INTEGER NOT NULL,
    source_offset    INTEGER NOT NULL,
    source_timestamp INTEGER,
    event_id         TEXT,
    event_name       TEXT,
    payload          BLOB    NOT NULL,
    headers          TEXT    NOT NULL,
    held_ms          INTEGER NOT NULL,
    UNIQUE (consumer_group, source_topic, source_partition, source_offset)
);
CREATE INDEX idx_held_records_key ON held_records (consumer_group, record_key, id);
