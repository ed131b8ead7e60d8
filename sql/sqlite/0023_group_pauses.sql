-- An operator's pause of a consumer group (see the MariaDB migration).
CREATE TABLE group_pauses (
    consumer_group TEXT    NOT NULL PRIMARY KEY,
    paused_at_ms   INTEGER NOT NULL,
    until_ms       INTEGER NULL,
    paused_by      TEXT    NOT NULL,
    reason         TEXT    NOT NULL
);
