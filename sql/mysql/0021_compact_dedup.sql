-- Compact dedup rows (issue 26). The old row keyed on (consumer_group
-- VARCHAR(255), event_id CHAR(36)) in utf8mb4: up to 1,164 bytes of primary
-- key, repeated in every secondary index, plus an index on created_at. The
-- new row keys on (group_id SMALLINT, event_id BINARY(16)): 18 bytes. The
-- content digest keeps its first 8 bytes (a reused id is told apart with a
-- 2^-64 chance of missing it), and created_at is kept unindexed: cleanup,
-- reconcile and the console find a time's first apply_seq by a binary
-- search over the apply_seq index (src/dedup/mod.rs, seq_floor).
--
-- Upgrade without losing dedup memory. The old table becomes
-- event_dedup_legacy and stays readable: a claim also looks its ids up
-- there, so an event applied before the upgrade and redelivered after it is
-- skipped. `orderpipe dedup upgrade` then moves the old rows over in bounded
-- batches, online, and drops the legacy table when it is empty. An install
-- with no dedup rows has nothing to move: its legacy table is dropped here.
--
-- Consumers of earlier releases must be stopped before this migration:
-- they write the old columns (docs/operations.md, "Upgrading to compact
-- dedup rows").

CREATE TABLE dedup_groups (
    id   SMALLINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name VARCHAR(255)      NOT NULL,
    UNIQUE KEY uq_dedup_groups_name (name)
) ENGINE=InnoDB;

-- The primary key's prefix: a loose index scan, not a read of every row.
INSERT INTO dedup_groups (name) SELECT DISTINCT consumer_group FROM event_dedup ORDER BY consumer_group;

RENAME TABLE event_dedup TO event_dedup_legacy;

CREATE TABLE event_dedup (
    group_id        SMALLINT UNSIGNED NOT NULL,
    event_id        BINARY(16)   NOT NULL,
    apply_seq       BIGINT       NOT NULL AUTO_INCREMENT,
    topic           VARCHAR(255) NOT NULL,
    kafka_partition INT          NOT NULL,
    kafka_offset    BIGINT       NOT NULL,
    event_type      VARCHAR(128) NOT NULL,
    record_key      VARCHAR(255) NOT NULL,
    payload_digest  BINARY(8)    NULL,
    created_at      DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (group_id, event_id),
    UNIQUE KEY uq_event_dedup_apply_seq (apply_seq)
) ENGINE=InnoDB;

-- New rows number after every old one, so the moved rows keep their
-- apply_seq (the order effects were applied in) and never collide.
SET @orderpipe_next_seq = (SELECT COALESCE(MAX(apply_seq), 0) + 1 FROM event_dedup_legacy);
SET @orderpipe_sql = CONCAT('ALTER TABLE event_dedup AUTO_INCREMENT = ', @orderpipe_next_seq);
PREPARE orderpipe_stmt FROM @orderpipe_sql;
EXECUTE orderpipe_stmt;
DEALLOCATE PREPARE orderpipe_stmt;

SET @orderpipe_sql = IF(EXISTS (SELECT 1 FROM event_dedup_legacy), 'DO 0', 'DROP TABLE event_dedup_legacy');
PREPARE orderpipe_stmt FROM @orderpipe_sql;
EXECUTE orderpipe_stmt;
DEALLOCATE PREPARE orderpipe_stmt;

-- The rows as people read them: group names and event ids as text. For
-- operators, scripts and tests; the consumer reads the table.
CREATE VIEW applied_events AS
SELECT g.name AS consumer_group,
       LOWER(CONCAT_WS('-', HEX(SUBSTR(d.event_id, 1, 4)), HEX(SUBSTR(d.event_id, 5, 2)),
             HEX(SUBSTR(d.event_id, 7, 2)), HEX(SUBSTR(d.event_id, 9, 2)), HEX(SUBSTR(d.event_id, 11, 6)))) AS event_id,
       d.apply_seq, d.topic, d.kafka_partition, d.kafka_offset, d.event_type, d.record_key,
       LOWER(HEX(d.payload_digest)) AS payload_digest, d.created_at
FROM event_dedup d JOIN dedup_groups g ON g.id = d.group_id;
