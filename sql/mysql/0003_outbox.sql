-- Producer side (MariaDB / MySQL): the reference order service's table and
-- the transactional outbox the relay publishes from.

-- Orders under a state machine: created -> paid -> shipped -> refunded,
-- created -> canceled, paid -> refunded.
CREATE TABLE orders (
    order_id   BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    user_id    BIGINT       NOT NULL,
    sku        VARCHAR(64)  NOT NULL,
    quantity   INT          NOT NULL,
    amount     BIGINT       NOT NULL,
    currency   CHAR(3)      NOT NULL,
    status     VARCHAR(16)  NOT NULL,
    created_at VARCHAR(32)  NOT NULL,
    updated_at VARCHAR(32)  NOT NULL
) ENGINE=InnoDB;

-- One row per event to publish, written in the business transaction.
-- shard = order_id mod 16: a relay owns whole shards (relay_leases), so one
-- order's events are always published by one relay, in id order.
-- tx_id groups the rows of one business transaction: the relay never splits
-- them across Kafka transactions.
CREATE TABLE outbox_messages (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id    CHAR(36)     NOT NULL UNIQUE,
    tx_id       CHAR(36)     NOT NULL,
    shard       INT          NOT NULL,
    topic       VARCHAR(255) NOT NULL,
    message_key VARCHAR(255) NOT NULL,
    event_name  VARCHAR(128) NOT NULL,
    envelope    TEXT         NOT NULL,
    created_ms  BIGINT       NOT NULL,
    sent_ms     BIGINT       NULL,
    KEY idx_outbox_unsent (sent_ms, id),
    KEY idx_outbox_tx (tx_id)
) ENGINE=InnoDB;

-- Which relay instance publishes which shard, until when.
CREATE TABLE relay_leases (
    shard      INT          NOT NULL PRIMARY KEY,
    owner      VARCHAR(255) NOT NULL,
    expires_ms BIGINT       NOT NULL
) ENGINE=InnoDB;
INSERT INTO relay_leases (shard, owner, expires_ms) VALUES
 (0,'',0),(1,'',0),(2,'',0),(3,'',0),(4,'',0),(5,'',0),(6,'',0),(7,'',0),
 (8,'',0),(9,'',0),(10,'',0),(11,'',0),(12,'',0),(13,'',0),(14,'',0),(15,'',0);

-- Live relay instances (heartbeat every lease_ttl/3), so a newcomer without
-- leases is counted and the others give it its share of the shards.
CREATE TABLE relay_instances (
    owner        VARCHAR(255) NOT NULL PRIMARY KEY,
    heartbeat_ms BIGINT       NOT NULL
) ENGINE=InnoDB;
