-- The console's own history of each group's figures, for its charts when no
-- Prometheus is configured (console.prometheus_url unset): one row per group
-- per sample interval. sampled_ms is rounded down to the interval, so two
-- consoles write the same rows (REPLACE); rows older than a day are deleted
-- by the sampler, so the table stays bounded. lag_records is NULL when the
-- broker did not answer.
CREATE TABLE console_samples (
    sampled_ms           BIGINT       NOT NULL,
    consumer_group       VARCHAR(255) NOT NULL,
    lag_records          BIGINT       NULL,
    applied_per_sec      DOUBLE       NOT NULL,
    failure_rate_pct     DOUBLE       NULL,
    dead_letters_per_min DOUBLE       NOT NULL,
    parked_keys          BIGINT       NOT NULL,
    PRIMARY KEY (consumer_group, sampled_ms),
    KEY console_samples_by_time (sampled_ms)
) ENGINE=InnoDB;
