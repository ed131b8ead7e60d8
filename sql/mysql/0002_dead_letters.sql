-- Dead letters persisted from order.events.v1.dlq (MariaDB / MySQL).
-- One row per failed record and group, unique on where the record came from,
-- so re-consuming the DLQ topic inserts nothing twice. A record that fails
-- again after a replay updates its row (newer dlq_offset) back to pending.
CREATE TABLE dead_letters (
    id                 BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_group     VARCHAR(255)  NOT NULL,
    original_topic     VARCHAR(255)  NOT NULL,
    original_partition INT           NOT NULL,
    original_offset    BIGINT        NOT NULL,
    original_timestamp BIGINT        NULL,
    record_key         VARBINARY(1024) NULL,
    payload            LONGBLOB      NULL,
    headers            TEXT          NOT NULL,
    event_id           VARCHAR(64)   NULL,
    event_name         VARCHAR(128)  NULL,
    error_class        VARCHAR(64)   NOT NULL,
    error_message      TEXT          NOT NULL,
    attempts           INT           NOT NULL,
    first_failure_ms   BIGINT        NOT NULL,
    last_failure_ms    BIGINT        NOT NULL,
    status             VARCHAR(16)   NOT NULL DEFAULT 'pending',
    replay_count       INT           NOT NULL DEFAULT 0,
    last_replayed_ms   BIGINT        NULL,
    ignored_reason     TEXT          NULL,
    dlq_partition      INT           NOT NULL,
    dlq_offset         BIGINT        NOT NULL,
    created_ms         BIGINT        NOT NULL,
    updated_ms         BIGINT        NOT NULL,
    UNIQUE KEY uq_dead_letters_origin (consumer_group, original_topic, original_partition, original_offset),
    KEY idx_dead_letters_status (status, consumer_group),
    KEY idx_dead_letters_last_failure (last_failure_ms)
) ENGINE=InnoDB;
