-- Consumer side: the dedup table and the business tables of the built-in
-- handlers (MariaDB / MySQL).

-- One row per (group, event) applied. The key is the pair, not event_id alone:
-- groups share this table and each must apply every event once.
-- apply_seq records the order effects were applied in (audits, order checks).
CREATE TABLE event_dedup (
    consumer_group  VARCHAR(255) NOT NULL,
    event_id        CHAR(36)     NOT NULL,
    apply_seq       BIGINT       NOT NULL AUTO_INCREMENT UNIQUE,
    topic           VARCHAR(255) NOT NULL,
    kafka_partition INT          NOT NULL,
    kafka_offset    BIGINT       NOT NULL,
    event_type      VARCHAR(128) NOT NULL,
    record_key      VARCHAR(255) NOT NULL,
    created_at      DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (consumer_group, event_id),
    KEY idx_event_dedup_created_at (created_at)
) ENGINE=InnoDB;

-- inventory: reserve on order.created, release on order.canceled.
-- Business idempotency: one reservation per order; release only from reserved.
CREATE TABLE inventory_reservations (
    order_id    BIGINT       NOT NULL PRIMARY KEY,
    sku         VARCHAR(64)  NOT NULL,
    quantity    INT          NOT NULL,
    status      VARCHAR(16)  NOT NULL,
    reserved_at VARCHAR(32)  NOT NULL,
    released_at VARCHAR(32)  NULL
) ENGINE=InnoDB;

-- payment: record on order.payment.succeeded, refund on order.refunded.
-- Business idempotency: one payment per order; refund only from paid.
CREATE TABLE payments (
    order_id    BIGINT       NOT NULL PRIMARY KEY,
    payment_id  VARCHAR(64)  NOT NULL UNIQUE,
    amount      BIGINT       NOT NULL,
    status      VARCHAR(16)  NOT NULL,
    paid_at     VARCHAR(32)  NOT NULL,
    refund_id   VARCHAR(64)  NULL UNIQUE,
    refunded_at VARCHAR(32)  NULL
) ENGINE=InnoDB;

-- logistics: a shipment on order.shipped. One shipment per order.
CREATE TABLE shipments (
    order_id    BIGINT       NOT NULL PRIMARY KEY,
    shipment_id VARCHAR(64)  NOT NULL UNIQUE,
    carrier     VARCHAR(64)  NOT NULL,
    shipped_at  VARCHAR(32)  NOT NULL
) ENGINE=InnoDB;

-- notification: one row per user-visible event. Unique per event.
CREATE TABLE notifications (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id   CHAR(36)     NOT NULL UNIQUE,
    order_id   BIGINT       NOT NULL,
    kind       VARCHAR(64)  NOT NULL,
    created_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    KEY idx_notifications_order (order_id)
) ENGINE=InnoDB;

-- points: earn on payment, reverse on refund. One entry of each kind per order.
CREATE TABLE points_ledger (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id   BIGINT       NOT NULL,
    entry_type VARCHAR(16)  NOT NULL,
    points     BIGINT       NOT NULL,
    event_id   CHAR(36)     NOT NULL UNIQUE,
    UNIQUE KEY uq_points_order_entry (order_id, entry_type)
) ENGINE=InnoDB;
