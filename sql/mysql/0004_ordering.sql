-- Per-order ordering through retries, the DLQ and replay (consumer.ordering = key).
-- A key whose record left a group's main path (retry topic or DLQ) is parked
-- for that group until that record, the head, is applied; later records of
-- the key are held here meanwhile, then applied in their original order.

-- One row per parked key and group. head_origin is where the head was first
-- consumed (topic/partition/offset: stable across retry hops and replays).
-- state: retrying (head in the retry topic), dead (head dead-lettered),
-- release (an operator ignored the head and asked to release the followers).
CREATE TABLE parked_keys (
    consumer_group  VARCHAR(255) NOT NULL,
    record_key      VARCHAR(255) NOT NULL,
    kafka_partition INT          NOT NULL,
    head_origin     VARCHAR(512) NOT NULL,
    head_event_id   VARCHAR(64)  NULL,
    head_event_name VARCHAR(128) NULL,
    state           VARCHAR(16)  NOT NULL,
    parked_ms       BIGINT       NOT NULL,
    updated_ms      BIGINT       NOT NULL,
    PRIMARY KEY (consumer_group, record_key),
    KEY idx_parked_keys_partition (consumer_group, kafka_partition)
) ENGINE=InnoDB;

-- Records held behind a parked key, in arrival order (id). Holding is
-- idempotent per source record: a redelivered record is not held twice.
-- An undecodable record behind a parked key is held too (no event id): it
-- fails again on release and becomes the head, dead-lettered.
CREATE TABLE held_records (
    id               BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_group   VARCHAR(255)  NOT NULL,
    record_key       VARCHAR(255)  NOT NULL,
    source_topic     VARCHAR(255)  NOT NULL,
    source_partition INT           NOT NULL,
    source_offset    BIGINT        NOT NULL,
    source_timestamp BIGINT        NULL,
    event_id         VARCHAR(64)   NULL,
    event_name       VARCHAR(128)  NULL,
    payload          LONGBLOB      NOT NULL,
    headers          TEXT          NOT NULL,
    held_ms          BIGINT        NOT NULL,
    UNIQUE KEY uq_held_records_source (consumer_group, source_topic, source_partition, source_offset),
    KEY idx_held_records_key (consumer_group, record_key, id)
) ENGINE=InnoDB;
