-- Subscriptions as data for the embedded default (SQLite); see sql/mysql/0012_subscriptions.sql.
CREATE TABLE cdc_sources (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL UNIQUE,
    db_host     TEXT    NOT NULL,
    db_port     INTEGER NOT NULL,
    db_user     TEXT    NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1,
    description TEXT    NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);

CREATE TABLE event_definitions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    routing_key TEXT    NOT NULL UNIQUE,
    topic       TEXT    NOT NULL,
    source_id   INTEGER NULL REFERENCES cdc_sources (id),
    description TEXT    NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);

CREATE TABLE downstream_consumers (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL UNIQUE,
    http_method TEXT    NOT NULL,
    http_url    TEXT    NOT NULL,
    timeout_ms  INTEGER NOT NULL,
    retry_json  TEXT    NULL,
    channel_id  TEXT    NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1,
    description TEXT    NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);

CREATE TABLE subscriptions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    INTEGER NOT NULL REFERENCES event_definitions (id),
    consumer_id INTEGER NOT NULL REFERENCES downstream_consumers (id),
    bind_key    TEXT    NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1,
    description TEXT    NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (event_id, consumer_id)
);
CREATE INDEX idx_subscriptions_binding ON subscriptions (consumer_id, bind_key);

CREATE TABLE property_filters (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    subscription_id INTEGER NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
    position        INTEGER NOT NULL,
    field           TEXT    NOT NULL,
    op              TEXT    NOT NULL,
    value_json      TEXT    NULL,
    from_json       TEXT    NULL,
    to_json         TEXT    NULL
);
CREATE INDEX idx_property_filters_subscription ON property_filters (subscription_id, position);

CREATE TABLE control_requests (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT    NOT NULL,
    consumer_name TEXT    NULL,
    origin        TEXT    NOT NULL,
    requested_ms  INTEGER NOT NULL
);
