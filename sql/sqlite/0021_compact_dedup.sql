-- Compact dedup rows for the embedded default (SQLite); see
-- sql/mysql/0021_compact_dedup.sql for the why. An embedded database is
-- small and has one writer, so its rows are converted here, in the
-- migration's transaction, rather than moved by `orderpipe dedup upgrade`.

CREATE TABLE dedup_groups (
    id   INTEGER PRIMARY KEY,
    name TEXT    NOT NULL UNIQUE
);
INSERT INTO dedup_groups (name) SELECT DISTINCT consumer_group FROM event_dedup ORDER BY consumer_group;

ALTER TABLE event_dedup RENAME TO event_dedup_legacy;
DROP INDEX idx_event_dedup_apply_seq;
DROP INDEX idx_event_dedup_created_at;

CREATE TABLE event_dedup (
    group_id        INTEGER NOT NULL,
    event_id        BLOB    NOT NULL,
    apply_seq       INTEGER NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    INTEGER NOT NULL,
    event_type      TEXT    NOT NULL,
    record_key      TEXT    NOT NULL,
    payload_digest  BLOB,
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (group_id, event_id)
);
CREATE UNIQUE INDEX idx_event_dedup_apply_seq ON event_dedup (apply_seq);

INSERT INTO event_dedup (group_id, event_id, apply_seq, topic, kafka_partition, kafka_offset, event_type,
                         record_key, payload_digest, created_at)
SELECT g.id, unhex(replace(l.event_id, '-', '')), l.apply_seq, l.topic, l.kafka_partition, l.kafka_offset,
       l.event_type, l.record_key, unhex(substr(l.payload_digest, 1, 16)), l.created_at
FROM event_dedup_legacy l JOIN dedup_groups g ON g.name = l.consumer_group;

DROP TABLE event_dedup_legacy;

CREATE VIEW applied_events AS
SELECT g.name AS consumer_group,
       lower(hex(substr(d.event_id, 1, 4)) || '-' || hex(substr(d.event_id, 5, 2)) || '-' ||
             hex(substr(d.event_id, 7, 2)) || '-' || hex(substr(d.event_id, 9, 2)) || '-' ||
             hex(substr(d.event_id, 11, 6))) AS event_id,
       d.apply_seq, d.topic, d.kafka_partition, d.kafka_offset, d.event_type, d.record_key,
       nullif(lower(hex(d.payload_digest)), '') AS payload_digest, d.created_at
FROM event_dedup d JOIN dedup_groups g ON g.id = d.group_id;
