-- Event integrity at the consumer: a digest of each applied event's content
-- beside its dedup row, and the duplicates whose content differed from it
-- (a producer reused an event id). `orderpipe dlq conflicts` lists them.

-- sha256 (64 hex digits) of the event's content: event_name, event_time,
-- producer and data in a canonical form (see src/dedup.rs). NULL for rows
-- written before this migration: unknown, never reported as a conflict.
-- Adding a NULL column at the end is an instant ALTER on MariaDB >= 10.3.
ALTER TABLE event_dedup ADD COLUMN payload_digest CHAR(64) CHARACTER SET ascii NULL;

-- One row per conflicting duplicate record (redelivering it does not list it
-- twice). first_*: where the event applied under this id came from (its
-- dedup row); topic/kafka_partition/kafka_offset: the record skipped.
CREATE TABLE event_conflicts (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_group  VARCHAR(255) NOT NULL,
    event_id        CHAR(36)     NOT NULL,
    event_name      VARCHAR(128) NOT NULL,
    first_topic     VARCHAR(255) NOT NULL,
    first_partition INT          NOT NULL,
    first_offset    BIGINT       NOT NULL,
    first_digest    CHAR(64)     CHARACTER SET ascii NOT NULL,
    topic           VARCHAR(255) NOT NULL,
    kafka_partition INT          NOT NULL,
    kafka_offset    BIGINT       NOT NULL,
    digest          CHAR(64)     CHARACTER SET ascii NOT NULL,
    detected_ms     BIGINT       NOT NULL,
    UNIQUE KEY uq_event_conflicts_record (consumer_group, topic, kafka_partition, kafka_offset),
    KEY idx_event_conflicts_group (consumer_group, id)
) ENGINE=InnoDB;
