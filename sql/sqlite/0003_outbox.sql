-- Producer side for the embedded default (SQLite); see sql/mysql/0003_outbox.sql.
CREATE TABLE orders (
    order_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id    INTEGER NOT NULL,
    sku        TEXT    NOT NULL,
    quantity   INTEGER NOT NULL,
    amount     INTEGER NOT NULL,
    currency   TEXT    NOT NULL,
    status     TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    updated_at TEXT    NOT NULL
);

CREATE TABLE outbox_messages (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT    NOT NULL UNIQUE,
    tx_id       TEXT    NOT NULL,
    shard       INTEGER NOT NULL,
    topic       TEXT    NOT NULL,
    message_key TEXT    NOT NULL,
    event_name  TEXT    NOT NULL,
    envelope    TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL,
    sent_ms     INTEGER
);
CREATE INDEX idx_outbox_unsent ON outbox_messages (sent_ms, id);
CREATE INDEX idx_outbox_tx ON outbox_messages (tx_id);

CREATE TABLE relay_leases (
    shard      INTEGER PRIMARY KEY,
    owner      TEXT    NOT NULL,
    expires_ms INTEGER NOT NULL
);
INSERT INTO relay_leases (shard, owner, expires_ms) VALUES
 (0,'',0),(1,'',0),(2,'',0),(3,'',0),(4,'',0),(5,'',0),(6,'',0),(7,'',0),
 (8,'',0),(9,'',0),(10,'',0),(11,'',0),(12,'',0),(13,'',0),(14,'',0),(15,'',0);

CREATE TABLE relay_instances (
    owner        TEXT    NOT NULL PRIMARY KEY,
    heartbeat_ms INTEGER NOT NULL
);
