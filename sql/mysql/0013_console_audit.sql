-- The operator console's audit trail (src/console/audit.rs): one row per
-- state change made through `orderpipe console` (replay, ignore, release,
-- subscription edits), written before the change is reported done.
-- who: the proxy's user name, or viewer-token / operator-token;
-- target: JSON, the filter or the item acted on; item_count: how many
-- items the action covered. at_ms: ms since the epoch (UTC).
CREATE TABLE console_audit (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at_ms      BIGINT       NOT NULL,
    who        VARCHAR(255) NOT NULL,
    role       VARCHAR(16)  NOT NULL,
    action     VARCHAR(64)  NOT NULL,
    target     TEXT         NOT NULL,
    item_count BIGINT       NOT NULL,
    outcome    VARCHAR(255) NOT NULL,
    KEY idx_console_audit_at (at_ms)
) ENGINE=InnoDB;
