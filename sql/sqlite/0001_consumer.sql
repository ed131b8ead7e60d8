-- Consumer side for the embedded default (SQLite). Same tables and keys as
-- sql/mysql/0001_consumer.sql; see there for the why of each.

CREATE TABLE event_dedup (
    consumer_group  TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    apply_seq       INTEGER NOT NULL,
    topic           TEXT    NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    INTEGER NOT NULL,
    event_type      TEXT    NOT NULL,
    record_key      TEXT    NOT NULL,
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (consumer_group, event_id)
);
CREATE UNIQUE INDEX idx_event_dedup_apply_seq ON event_dedup (apply_seq);
CREATE INDEX idx_event_dedup_created_at ON event_dedup (created_at);

CREATE TABLE inventory_reservations (
    order_id    INTEGER NOT NULL PRIMARY KEY,
    sku         TEXT    NOT NULL,
    quantity    INTEGER NOT NULL,
    status      TEXT    NOT NULL,
    reserved_at TEXT    NOT NULL,
    released_at TEXT
);

CREATE TABLE payments (
    order_id    INTEGER NOT NULL PRIMARY KEY,
    payment_id  TEXT    NOT NULL UNIQUE,
    amount      INTEGER NOT NULL,
    status      TEXT    NOT NULL,
    paid_at     TEXT    NOT NULL,
    refund_id   TEXT    UNIQUE,
    refunded_at TEXT
);

CREATE TABLE shipments (
    order_id    INTEGER NOT NULL PRIMARY KEY,
    shipment_id TEXT    NOT NULL UNIQUE,
    carrier     TEXT    NOT NULL,
    shipped_at  TEXT    NOT NULL
);

CREATE TABLE notifications (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id   TEXT    NOT NULL UNIQUE,
    order_id   INTEGER NOT NULL,
    kind       TEXT    NOT NULL,
    created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
CREATE INDEX idx_notifications_order ON notifications (order_id);

CREATE TABLE points_ledger (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id   INTEGER NOT NULL,
    entry_type TEXT    NOT NULL,
    points     INTEGER NOT NULL,
    event_id   TEXT    NOT NULL UNIQUE,
    UNIQUE (order_id, entry_type)
);
