-- Subscriptions as data: the control plane of seed 003 (src/subscriptions).
-- Seed 003's maxwell_instance, event, consumer, sub_event and
-- event_property_setting in the house naming. `orderpipe subs ...` and the
-- admin API write them; the router (`orderpipe deliver` without
-- --subscription) reads the enabled ones: one consumer group per
-- (consumer, bind_key). Times are ms since the epoch (UTC).

-- Binlog sources (seed: maxwell_instance). No password here: the cdc
-- process reads it from its own configuration (a secret).
CREATE TABLE cdc_sources (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name        VARCHAR(64)  NOT NULL,
    db_host     VARCHAR(128) NOT NULL,
    db_port     INT          NOT NULL,
    db_user     VARCHAR(32)  NOT NULL,
    enabled     INT          NOT NULL DEFAULT 1,
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_ms  BIGINT       NOT NULL,
    updated_ms  BIGINT       NOT NULL,
    UNIQUE KEY uq_cdc_sources_name (name)
) ENGINE=InnoDB;

-- Events a subscription can name (seed: event): a routing key
-- `<db>.<table>.<insert|update|delete>` read from topic `cdc.<db>.<table>`,
-- or an order event name (`order.created`) read from the order topic.
CREATE TABLE event_definitions (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    routing_key VARCHAR(128) NOT NULL,
    topic       VARCHAR(255) NOT NULL,
    source_id   BIGINT       NULL,
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_ms  BIGINT       NOT NULL,
    updated_ms  BIGINT       NOT NULL,
    UNIQUE KEY uq_event_definitions_routing_key (routing_key),
    CONSTRAINT fk_event_definitions_source FOREIGN KEY (source_id) REFERENCES cdc_sources (id)
) ENGINE=InnoDB;

-- Downstream HTTP services (seed: consumer). retry_json: a retry layer
-- ({"delays": ["5s","30s","5m"]} or {"profile": "seed003"}), NULL = the
-- group's [retry] settings.
CREATE TABLE downstream_consumers (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name        VARCHAR(64)  NOT NULL,
    http_method VARCHAR(8)   NOT NULL,
    http_url    VARCHAR(512) NOT NULL,
    timeout_ms  BIGINT       NOT NULL,
    retry_json  TEXT         NULL,
    channel_id  VARCHAR(64)  NOT NULL,
    enabled     INT          NOT NULL DEFAULT 1,
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_ms  BIGINT       NOT NULL,
    updated_ms  BIGINT       NOT NULL,
    UNIQUE KEY uq_downstream_consumers_name (name)
) ENGINE=InnoDB;

-- Event -> consumer (seed: sub_event). Subscriptions of one consumer with
-- one bind_key share one consumer group and one ordered stream.
CREATE TABLE subscriptions (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id    BIGINT       NOT NULL,
    consumer_id BIGINT       NOT NULL,
    bind_key    VARCHAR(64)  NOT NULL,
    enabled     INT          NOT NULL DEFAULT 1,
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_ms  BIGINT       NOT NULL,
    updated_ms  BIGINT       NOT NULL,
    UNIQUE KEY uq_subscriptions_event_consumer (event_id, consumer_id),
    KEY idx_subscriptions_binding (consumer_id, bind_key),
    CONSTRAINT fk_subscriptions_event FOREIGN KEY (event_id) REFERENCES event_definitions (id),
    CONSTRAINT fk_subscriptions_consumer FOREIGN KEY (consumer_id) REFERENCES downstream_consumers (id)
) ENGINE=InnoDB;

-- A subscription's conditions on the change (seed: event_property_setting,
-- here per subscription), all of which must hold: op eq|ne (value_json),
-- in (value_json: an array), changed (from_json/to_json against `old` and
-- `data`; NULL = any). Values are JSON texts, so 1 and "1" stay distinct
-- as written (the comparison treats them as equal, see src/subscriptions/filter.rs).
CREATE TABLE property_filters (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    subscription_id BIGINT       NOT NULL,
    position        INT          NOT NULL,
    field           VARCHAR(64)  NOT NULL,
    op              VARCHAR(8)   NOT NULL,
    value_json      TEXT         NULL,
    from_json       TEXT         NULL,
    to_json         TEXT         NULL,
    KEY idx_property_filters_subscription (subscription_id, position),
    CONSTRAINT fk_property_filters_subscription FOREIGN KEY (subscription_id) REFERENCES subscriptions (id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- Requests to routers (seed: refresh_bindings / reload_config): every change
-- through the CLI or the admin API writes one in its transaction, and
-- POST /refresh and /reload write one; routers poll the latest id and
-- re-read the tables (all of them, or one consumer's) when it moves.
CREATE TABLE control_requests (
    id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    kind          VARCHAR(16)  NOT NULL,
    consumer_name VARCHAR(64)  NULL,
    origin        VARCHAR(16)  NOT NULL,
    requested_ms  BIGINT       NOT NULL
) ENGINE=InnoDB;
