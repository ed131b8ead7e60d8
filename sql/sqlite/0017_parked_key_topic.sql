-- Parked keys per topic for the embedded default (SQLite); see
-- sql/mysql/0017_parked_key_topic.sql for why, and why rows parked before
-- it get their head's topic. SQLite cannot change a primary key in place:
-- parked_keys is rebuilt.
ALTER TABLE held_records ADD COLUMN key_topic TEXT NOT NULL DEFAULT '';
UPDATE held_records SET key_topic = COALESCE(
    (SELECT p.head_topic FROM parked_keys p
     WHERE p.consumer_group = held_records.consumer_group AND p.record_key = held_records.record_key),
    source_topic);
DROP INDEX idx_held_records_key;
CREATE INDEX idx_held_records_key ON held_records (consumer_group, key_topic, record_key, id);

CREATE TABLE parked_keys_0017 (
    consumer_group  TEXT    NOT NULL,
    key_topic       TEXT    NOT NULL DEFAULT '',
    record_key      TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    head_origin     TEXT    NOT NULL,
    head_event_id   TEXT,
    head_event_name TEXT,
    state           TEXT    NOT NULL,
    parked_ms       INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    head_topic      TEXT    NOT NULL DEFAULT '',
    head_partition  INTEGER NOT NULL DEFAULT 0,
    head_offset     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer_group, key_topic, record_key)
);
INSERT INTO parked_keys_0017 (consumer_group, key_topic, record_key, kafka_partition, head_origin, head_event_id,
    head_event_name, state, parked_ms, updated_ms, head_topic, head_partition, head_offset)
SELECT consumer_group, head_topic, record_key, kafka_partition, head_origin, head_event_id,
    head_event_name, state, parked_ms, updated_ms, head_topic, head_partition, head_offset
FROM parked_keys;
DROP TABLE parked_keys;
ALTER TABLE parked_keys_0017 RENAME TO parked_keys;
CREATE INDEX idx_parked_keys_partition ON parked_keys (consumer_group, key_topic, kafka_partition);
