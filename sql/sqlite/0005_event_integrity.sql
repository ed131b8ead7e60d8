-- Event integrity for the embedded default (SQLite); see sql/mysql/0005_event_integrity.sql.
ALTER TABLE event_dedup ADD COLUMN payload_digest TEXT;

CREATE TABLE event_conflicts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_group  TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    event_name      TEXT    NOT NULL,
    first_topic     TEXT    NOT NULL,
    first_partition INTEGER NOT NULL,
    first_offset    INTEGER NOT NULL,
    first_digest    TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    INTEGER NOT NULL,
    digest          TEXT    NOT NULL,
    detected_ms     INTEGER NOT NULL,
    UNIQUE (consumer_group, topic, kafka_partition, kafka_offset)
);
CREATE INDEX idx_event_conflicts_group ON event_conflicts (consumer_group, id);
