-- Signals to a cdc source's incremental snapshots (src/snapshot_signals.rs),
-- Debezium's signal table in shape: type is execute-snapshot, stop-snapshot,
-- pause-snapshot or resume-snapshot; data is JSON, {"data-collections":
-- ["db.table"]}. The source applies the rows past the last id it applied
-- (kept in its checkpoint) and writes applied_at_ms and outcome back.
CREATE TABLE cdc_signals (
    id            BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    source        VARCHAR(255)  NOT NULL,
    type          VARCHAR(32)   NOT NULL,
    data          TEXT          NOT NULL,
    requested_by  VARCHAR(255)  NOT NULL DEFAULT 'sql',
    created_at_ms BIGINT        NOT NULL DEFAULT 0,
    applied_at_ms BIGINT        NULL,
    outcome       VARCHAR(1000) NULL,
    KEY cdc_signals_source (source, id)
) ENGINE=InnoDB;
