-- The console's own history of each group's figures (see the MariaDB migration).
CREATE TABLE console_samples (
    sampled_ms           INTEGER NOT NULL,
    consumer_group       TEXT    NOT NULL,
    lag_records          INTEGER NULL,
    applied_per_sec      REAL    NOT NULL,
    failure_rate_pct     REAL    NULL,
    dead_letters_per_min REAL    NOT NULL,
    parked_keys          INTEGER NOT NULL,
    PRIMARY KEY (consumer_group, sampled_ms)
);
CREATE INDEX console_samples_by_time ON console_samples (sampled_ms);
