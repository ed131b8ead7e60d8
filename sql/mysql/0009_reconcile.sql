-- Produced-vs-applied reconciliation (`orderpipe reconcile`, seed 001's
-- 对账任务). One row per run: the window of the order topic it read, what
-- it found, and when it finished. A role that runs anyway exports the
-- latest run of each group as gauges (src/reconcile/store.rs), so the
-- CronJob that runs it needs no /metrics of its own. Runs older than 30
-- days are deleted by the next run.
CREATE TABLE reconcile_runs (
    id                   BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer_group       VARCHAR(255) NOT NULL,
    topic                VARCHAR(255) NOT NULL,
    since_ms             BIGINT       NOT NULL,
    until_ms             BIGINT       NOT NULL,
    grace_ms             BIGINT       NOT NULL,
    records              BIGINT       NOT NULL,
    applied              BIGINT       NOT NULL,
    dead_lettered        BIGINT       NOT NULL,
    held                 BIGINT       NOT NULL,
    parked               BIGINT       NOT NULL,
    unconsumed           BIGINT       NOT NULL,
    in_flight            BIGINT       NOT NULL,
    missing              BIGINT       NOT NULL,
    applied_not_in_topic BIGINT       NOT NULL,
    -- Kafka timestamp (ms) of the oldest missing record; NULL when none is missing.
    oldest_missing_ms    BIGINT       NULL,
    started_ms           BIGINT       NOT NULL,
    finished_ms          BIGINT       NOT NULL,
    KEY idx_reconcile_runs_group (consumer_group, id),
    KEY idx_reconcile_runs_finished (finished_ms)
) ENGINE=InnoDB;
