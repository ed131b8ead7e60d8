-- An operator's pause of a consumer group (`orderpipe group pause`), in
-- force while the row exists and until_ms (ms since the epoch) has not
-- passed; every member of the group reads it each second. Times as epoch
-- ms, like relay_source_leases: no session time zone in the comparison.
CREATE TABLE group_pauses (
    consumer_group VARCHAR(255)  NOT NULL PRIMARY KEY,
    paused_at_ms   BIGINT        NOT NULL,
    until_ms       BIGINT        NULL,
    paused_by      VARCHAR(255)  NOT NULL,
    reason         VARCHAR(1000) NOT NULL
) ENGINE=InnoDB;
