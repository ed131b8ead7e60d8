-- Bulk replays of dead letters, as they run (src/dlq/progress.rs): one row
-- per `orderpipe dlq replay` or console "replay a filter", its selection
-- (JSON), the rows counted when it started, delivery reports settled so far
-- (written about once a second), and its end. The CLI and every console
-- replica read the same rows, so a console shows a replay started from the
-- CLI, or from another replica. origin: cli | console; state: running |
-- done | stopped (ended early: error says why). A process killed mid-replay
-- leaves its row `running` with an old updated_ms (shown as stalled).
CREATE TABLE dlq_replays (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    origin      VARCHAR(16)  NOT NULL,
    started_by  VARCHAR(255) NOT NULL,
    selection   TEXT         NOT NULL,
    total       BIGINT       NOT NULL,
    settled     BIGINT       NOT NULL DEFAULT 0,
    replayed    BIGINT       NOT NULL DEFAULT 0,
    failed      BIGINT       NOT NULL DEFAULT 0,
    state       VARCHAR(16)  NOT NULL,
    error       TEXT         NULL,
    started_ms  BIGINT       NOT NULL,
    updated_ms  BIGINT       NOT NULL,
    finished_ms BIGINT       NULL,
    KEY idx_dlq_replays_state (state, started_ms)
) ENGINE=InnoDB;
